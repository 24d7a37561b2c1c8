"""Every template of the sdist's models/templates whose format has tool calls (P2 included):
random tool schemas and calls, the call as the template writes it in an assistant turn
(rendered as the server renders, llama.cpp's rules) parses back to the same call, whole and
streamed, and the grammar `tool_choice: required` builds accepts it (as
test_formats_roundtrip does for the P0/P1 formats with plain jinja2).

Left out here, covered by test_formats_roundtrip_rest (so all 70 templates are):
- LFM2-8B-A1B, LFM2.5-Instruct: their templates write no `tool_calls` in an assistant turn
  (the model's calls live in its content); their sibling LFM2.5-8B-A1B writes the call.
- SmolLM3, R1 Distill Llama 8B, Gemma 2, Granite 3.3, RWKV World, Phi 3.5: llama.cpp finds
  no tool format (no grammar, no parsed call); their forced calls are checked there.

Solar Open writes each call's id before its name (`<|tool_call:begin|>ID<|tool_call:name|>`):
llama-server's description bakes the analyser's sentinel id into the name marker, ours reads
the id as the call's own, so the call parses back with the id the template wrote.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.parse import ChatParser, arguments_object
from loraserve.chat.formats.special.grammars import dialect_grammar
from tests.unit.chat.format_util import TEMPLATES, assistant_text, grammar_accepts
from tests.unit.chat.oracle_util import template_format
from tests.unit.chat.roundtrip_util import (
    ALL,
    STOPS,
    WITH_TOOLS,
    check_stream,
    named_token,
    server_render,
    tool_and_call,
)


def test_most_templates_are_covered() -> None:
    assert len(ALL) == 70 and len(WITH_TOOLS) >= 62


@pytest.mark.parametrize("name", WITH_TOOLS)
def test_template_written_call_parses_back(name: str) -> None:
    src = (TEMPLATES / name).read_text()
    logging.disable(logging.WARNING)
    fmt = template_format(name)
    logging.disable(logging.NOTSET)

    @settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
    @given(tool_and_call())
    def check(case: tuple[dict, dict]) -> None:
        tool, args = case
        fn = tool["function"]["name"]
        call: dict[str, Any] = {"id": "abc123def", "type": "function",
                                "function": {"name": fn, "arguments": args}}  # fmt: skip
        msg = {"role": "assistant", "content": "", "tool_calls": [call]}
        text = assistant_text(src, msg, [tool], server_render(src))
        for stop in STOPS:
            text = text.removesuffix(stop)
        parser = ChatParser(fmt, [tool])
        whole = parser.parse(text, partial=False)
        assert [c.name for c in whole.tool_calls] == [fn], (text, whole)
        assert arguments_object(whole.tool_calls[0].arguments) == args, (text, whole)
        if "abc123def" in text:  # a format that writes the id reads it back
            assert whole.tool_calls[0].id == "abc123def", (text, whole)
        streamed = check_stream(parser, text)
        assert json.loads(streamed[0]["arguments"]) == args
        named = named_token(fmt)
        lark = tool_grammar(fmt, [tool], "required", thinking_open=False, special=named)
        lark = lark or (dialect_grammar(fmt, [tool], "required", special=named)
                        if fmt.dialect and fmt.dialect != "harmony" else None)  # fmt: skip
        python_bools = fmt.tool_mode == "tag_tagged" and any(
            isinstance(v, bool) for v in args.values()
        )
        if lark is not None and not whole.reasoning_content and not python_bools:
            start = text if fmt.dialect else text.lstrip()
            body = text[text.find(fmt.trigger.strip()) :] if fmt.trigger else start
            specials = tuple(t for t in fmt.preserved_tokens if named(t))
            assert grammar_accepts(lark, body, specials) is None, (text, lark)

    check()
