"""Issue 31 item 3: the tool-call parsing `/v1/messages` (and the OpenAI chat routes) run on
an answer was quadratic (a regex took 0.57 s on 8K characters). Here each call syntax's parser
(`ChatParser`, formats detected from the peer's templates) reads 1 MB answers built to make a
backtracking or rescanning parser quadratic: a call start repeated, unclosed braces, quotes,
openers. A linear parser reads each in milliseconds; a quadratic one would take hours, so a
regression stops the suite at its time limit instead of passing (no timing is asserted)."""

from __future__ import annotations

import pytest

from loraserve.chat.formats.parse import ChatParser
from tests.unit.chat.oracle_util import template_format

TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}}}}}  # fmt: skip
TEMPLATES = [
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",  # <tool_call>{json}
    "Qwen3-Coder.jinja",  # XML-tagged arguments
    "Mistral-Small-3.2-24B-Instruct-2506.jinja",  # [TOOL_CALLS]name[ARGS]{json}
    "deepseek-ai-DeepSeek-V3.1.jinja",  # special-token sections
    "Kimi-K2-Instruct.jinja",
    "GLM-4.6.jinja",
]
SIZE = 1 << 20


@pytest.mark.parametrize("name", TEMPLATES)
def test_hostile_answers_parse_in_one_pass(name: str) -> None:
    fmt = template_format(name)
    parser = ChatParser(fmt, [TOOL])
    start = fmt.trigger or "<tool_call>"
    units = [start + '{"name": "f", "arguments": {"a": "', start + " ", "{", '"', start,
             start + '{"name": "f", "arguments": {"a": "x"}}' + " "]  # fmt: skip
    for unit in units:
        text = unit * (SIZE // len(unit))
        for partial in (True, False):
            msg = parser.parse(text, partial=partial)
            # the answer is not lost: it is content, calls, or (partial) held back
            assert partial or msg.content or msg.tool_calls or msg.reasoning_content
