"""The grammar accepts llama.cpp's call cases, as llama.cpp's own test-chat checks its
grammar: for every whole parse case with tool calls in a format the description fields
spell (the dialects and harmony have their own tests), the Lark text `tool_grammar` builds
for the case's request (its tool_choice, parallel_tool_calls, and the reasoning its prompt
opened) accepts the model's output (`auto`: free text, then the calls from the trigger on),
the markers spelled as text.

Named exceptions, where our grammar is deliberately narrower than llama.cpp's GBNF:
- under `required` the call comes right after the reasoning (OpenAI's meaning; llama.cpp
  lets text come first): 18, 23;
- JSON arguments are written with the templates' separators (", ", ": ") and no free
  whitespace, which bounds a small model (llama.cpp allows any `space`): Ministral's
  `{"arg1":1}` 28, 29; Command R7B's action list indented over lines 48, 50, 339;
  StepFun's `{ "real": ..}` object value 444;
- tagged arguments follow the schema's order and types (Qwen3-Coder: arguments out of
  order 127-131, raw text for a type list or union 132-137);
- Kimi K2 answers whose calls lack their end markers 228-230, and MiniCPM5's CDATA value
  holding its own `</param>` 459.
"""

from __future__ import annotations

import logging

import pytest

from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.lead import opens_reasoning
from tests.unit.chat.format_util import grammar_accepts
from tests.unit.chat.test_formats_parse_oracle import CASES, _format, _prompt

NARROWER = {18, 23, 28, 29, 48, 50, 339, 444, 127, 128, 129, 130, 131, 132, 133, 136, 137,
            228, 229, 230, 459}  # fmt: skip


def _spelled_by_fields(name: str) -> bool:
    logging.disable(logging.WARNING)
    try:
        return not _format(name).dialect  # dialects: test_formats_roundtrip, test_tool_grammar
    finally:
        logging.disable(logging.NOTSET)


CALL_CASES = [
    c for c in CASES
    if not c["is_partial"] and c["request"]["tools"] and c["expect"]["tool_calls"]
    and c["id"] not in NARROWER and _spelled_by_fields(c["template"])
]  # fmt: skip


@pytest.mark.parametrize("case", CALL_CASES, ids=[str(c["id"]) for c in CALL_CASES])
def test_grammar_accepts_llama_cpps_call_case(case: dict) -> None:
    fmt, req = _format(case["template"]), case["request"]
    opened = opens_reasoning(fmt, _prompt(case, fmt))
    lark = tool_grammar(fmt, req["tools"], req["tool_choice"],
                        req.get("parallel_tool_calls", True), True, opened)  # fmt: skip
    assert lark is not None
    assert grammar_accepts(lark, case["input"]) is None, (case["input"], lark)


def test_most_call_cases_are_checked() -> None:
    assert len(CALL_CASES) >= 110
