"""An answer cut by the token limit inside a tool call: the deltas a stream sent add up to
the final message, and the whole (unstreamed) answer is that same message — the cut call
stays, with the arguments written so far (as OpenAI answers a `length` finish)."""

from __future__ import annotations

import json
import logging

import pytest

from loraserve.chat.formats.detect import detect
from loraserve.chat.formats.parse import ChatParser
from loraserve.chat.formats.stream import MessageStream
from tests.unit.chat.format_util import TEMPLATES, assistant_text, render_for
from tests.unit.chat.roundtrip_util import check_stream

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "x",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
ARGS = {"city": "Paris", "days": 3}
CALL = {"name": "get_weather", "arguments": ARGS}
TEMPLATES_P0 = [
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "Qwen3-Coder.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
]


def _two_calls_cut(name: str) -> tuple[ChatParser, str, str]:
    """The parser of template ``name`` and the text of two calls as it writes them; the
    second call's text is returned apart, to be cut."""
    src = (TEMPLATES / name).read_text()
    logging.disable(logging.WARNING)
    fmt = detect(src, render_for(src))
    logging.disable(logging.NOTSET)
    calls = [{"id": f"call{i}abcd", "type": "function", "function": CALL} for i in (1, 2)]
    one = assistant_text(src, {"role": "assistant", "content": "", "tool_calls": calls[:1]}, [TOOL])
    two = assistant_text(src, {"role": "assistant", "content": "", "tool_calls": calls}, [TOOL])
    return ChatParser(fmt, [TOOL]), one, two


@pytest.mark.parametrize("name", TEMPLATES_P0)
def test_a_call_cut_by_the_limit_stays_in_stream_and_whole(name: str) -> None:
    parser, one, two = _two_calls_cut(name)
    assert len(parser.parse(two, partial=False).tool_calls) == 2, two
    cut = two[: len(two) - (len(two) - len(one)) // 2]  # inside the second call's arguments
    streamed = check_stream(parser, cut)  # char by char: the deltas add up to the final
    whole = MessageStream(parser)  # the unstreamed answer: the text at once
    whole.feed(cut)
    whole.finish()
    assert whole.final is not None
    got = [(c.name, c.arguments) for c in whole.final.tool_calls]
    assert got == [(c["name"], c["arguments"]) for c in streamed.values()]
    assert len(got) >= 1 and json.loads(got[0][1]) == ARGS
    if len(got) == 2:  # the second call, cut: its arguments a prefix of the whole call's
        full = parser.parse(two, partial=False).tool_calls[1].arguments
        assert full.startswith(got[1][1]) or got[1][1] == ""
