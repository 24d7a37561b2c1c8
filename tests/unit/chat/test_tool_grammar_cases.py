"""The grammar accepts llama.cpp's call cases, as llama.cpp's own test-chat checks its
grammar: for every whole parse case with tool calls in a format the description fields
spell (the dialects and harmony have their own tests), the Lark text `tool_grammar` builds
for the case's request (its tool_choice, parallel_tool_calls, and the reasoning its prompt
opened) accepts the model's output (`auto`: free text, then the calls from the trigger on),
the markers spelled as text.

The grammars take what llama.cpp's take in these cases: JSON spaced by its schema
grammars' `space` (`{"arg1":1}`, an action list indented over lines), an optional id field
(Command R7B's `tool_call_id`), tagged arguments in the orders its parsers allow
(Qwen3-Coder's permuted required ones), a union with string as raw text, Kimi K2's calls
without end markers inside unclosed reasoning, MiniCPM5's CDATA values.

Named exceptions, where ours is narrower by design (issue 26: OpenAI's `required`):
- under `required` the call comes right after the reasoning; llama.cpp's grammar lets text
  come first (its `required` grammar is `reasoning content? calls`), so its cases 18 and 23
  (Qwen3.5: "Let me inspect..." before the call) are rejected here on purpose.
"""

from __future__ import annotations

import pytest

from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.lead import opens_reasoning
from tests.unit.chat.format_util import grammar_accepts
from tests.unit.chat.oracle_util import CASES, case_prompt, template_format

NARROWER = {18, 23}


def _spelled_by_fields(name: str) -> bool:
    return not template_format(name).dialect  # dialects: test_formats_roundtrip, test_tool_grammar


CALL_CASES = [
    c for c in CASES
    if not c["is_partial"] and c["request"]["tools"] and c["expect"]["tool_calls"]
    and c["id"] not in NARROWER and _spelled_by_fields(c["template"])
]  # fmt: skip


@pytest.mark.parametrize("case", CALL_CASES, ids=[str(c["id"]) for c in CALL_CASES])
def test_grammar_accepts_llama_cpps_call_case(case: dict) -> None:
    fmt, req = template_format(case["template"]), case["request"]
    opened = opens_reasoning(fmt, case_prompt(case, fmt))
    lark = tool_grammar(fmt, req["tools"], req["tool_choice"],
                        req.get("parallel_tool_calls", True), True, opened)  # fmt: skip
    assert lark is not None
    assert grammar_accepts(lark, case["input"]) is None, (case["input"], lark)


def test_every_call_case_but_the_named_ones_is_checked() -> None:
    assert len(CALL_CASES) >= 135


@pytest.mark.parametrize("case_id", sorted(NARROWER))
def test_required_rejects_text_before_the_call(case_id: int) -> None:
    case = next(c for c in CASES if c["id"] == case_id)
    fmt, req = template_format(case["template"]), case["request"]
    assert req["tool_choice"] == "required"
    opened = opens_reasoning(fmt, case_prompt(case, fmt))
    lark = tool_grammar(fmt, req["tools"], "required", True, True, opened)
    assert lark is not None and grammar_accepts(lark, case["input"]) is not None
    # the same answer with the call right after the reasoning: accepted from the trigger on
    text = case["input"].replace("Let me inspect the current directory.\n", "")
    assert text != case["input"] and grammar_accepts(lark, text) is None, text
