"""The specialised formats' grammars accept llama.cpp's call cases, as
test_tool_grammar_cases checks the formats the description fields spell: every whole parse
case with tool calls of a dialect (Gemma 4, DeepSeek V3.2/V4's DSML, LFM2, MiniMax-M3,
Ling 3, Kimi K3, Cohere2 MoE, Muse, Functionary v3.2; gpt-oss has test_tool_grammar), under
its tool_choice, parallel_tool_calls and the reasoning its prompt opened, markers spelled as
text. And the same answers with the reasoning opener left to the prompt (a reasoning
prefill: the answer starts inside the reasoning), which llama.cpp's answers start with.

llama.cpp's case 289 (LFM2, `auto`) writes a call inside its reasoning and the real call
after `</think>`; the lazy grammar let the text before the trigger run from the answer's
start, so the lexer ended it at the trigger inside the reasoning and the real call was
refused (and with the reasoning opened by the prompt, always: the two paths start with the
same text); with the markers as special tokens, reasoning text could hold no special token
at all, so the trigger token inside the reasoning was refused. llama.cpp's lazy grammar
ignores a trigger inside reasoning, so ours now does.

Case 73 (Gemma 4, `required`) opens a thought channel itself before the call: llama.cpp's
`required` grammar is `reasoning? content? calls`, so it is accepted there; ours refused
any reasoning block the prompt had not opened, so Gemma 4 (and every thinking template
whose generation prompt does not open reasoning) could not think at all under `required`.
Now one block of the answer's own is accepted before the forced call when the request
extracts reasoning (not with reasoning_format none: llama.cpp then has no reasoning rule),
and free text before the call stays refused (ours, issue 26: OpenAI's `required`).
"""

from __future__ import annotations

import pytest

from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.lead import opens_reasoning
from loraserve.chat.formats.special.lark import named
from tests.unit.chat.format_util import grammar_accepts
from tests.unit.chat.oracle_util import CASES, case_prompt, template_format

# markers as special tokens: a string argument that holds the format's special tokens
# (Ling 3's `</think>` and `<tool_call>` inside a value) is text only in ours
AS_TEXT_ONLY = {192}


def _dialect(name: str) -> str:
    return template_format(name).dialect


CALL_CASES = [
    c for c in CASES
    if not c["is_partial"] and c["request"]["tools"] and c["expect"]["tool_calls"]
    and _dialect(c["template"]) not in ("", "harmony")
]  # fmt: skip
WHOLE = CALL_CASES
OPENED = [
    c for c in CALL_CASES
    if template_format(c["template"]).reasoning_start.strip()
    and c["input"].startswith(template_format(c["template"]).reasoning_start.strip())
]  # fmt: skip


def _grammar(case: dict, opened: bool, specials: tuple[str, ...] = ()) -> str:
    req = case["request"]
    lark = tool_grammar(template_format(case["template"]), req["tools"], req["tool_choice"],
                        req.get("parallel_tool_calls", True), True, opened,
                        lambda m: m in specials)  # fmt: skip
    assert lark is not None
    return lark


@pytest.mark.parametrize("case", WHOLE, ids=[str(c["id"]) for c in WHOLE])
def test_grammar_accepts_llama_cpps_dialect_call_case(case: dict) -> None:
    fmt = template_format(case["template"])
    lark = _grammar(case, opens_reasoning(fmt, case_prompt(case, fmt)))
    assert grammar_accepts(lark, case["input"]) is None, (case["input"], lark)


@pytest.mark.parametrize("case", OPENED, ids=[str(c["id"]) for c in OPENED])
def test_grammar_accepts_the_case_after_a_reasoning_prefill(case: dict) -> None:
    start = template_format(case["template"]).reasoning_start.strip()
    lark = _grammar(case, True)
    text = case["input"][len(start) :]
    assert grammar_accepts(lark, text) is None, (text, lark)


@pytest.mark.parametrize("case", WHOLE, ids=[str(c["id"]) for c in WHOLE])
def test_grammar_accepts_the_case_with_special_tokens(case: dict) -> None:
    """The markers as the model's special tokens (its preserved `<..>` tokens): text
    never holds one, so a trigger inside reasoning (case 289) must be allowed there."""
    if case["id"] in AS_TEXT_ONLY:
        pytest.skip("a string value holding special tokens: text only in ours")
    fmt = template_format(case["template"])
    specials = tuple(sorted({t for t in fmt.preserved_tokens if named(t)}, key=len)[::-1])
    lark = _grammar(case, opens_reasoning(fmt, case_prompt(case, fmt)), specials)
    assert grammar_accepts(lark, case["input"], specials) is None, (case["input"], lark)


def test_every_dialect_call_case_is_checked() -> None:
    assert len(WHOLE) >= 124 and len(OPENED) >= 20
    assert {_dialect(c["template"]) for c in WHOLE} >= {
        "gemma_4", "deepseek_v3_2", "deepseek_v4", "lfm2", "lfm2_plain", "minimax_m3",
        "ling_3", "kimi_k3", "cohere2_moe", "muse_glimmer", "functionary_v3_2",
    }  # fmt: skip


def test_required_accepts_a_thought_the_answer_opens() -> None:
    """llama.cpp's case 73: a new thought block, then the forced call (refused before)."""
    case = next(c for c in CASES if c["id"] == 73)
    assert case["request"]["tool_choice"] == "required"
    fmt = template_format(case["template"])
    opened = opens_reasoning(fmt, case_prompt(case, fmt))
    assert not opened and case["input"].startswith("<|channel>thought")
    assert grammar_accepts(_grammar(case, opened), case["input"]) is None
    req = case["request"]
    # reasoning_format none: no reasoning rule (llama.cpp's), the block is free text
    none = tool_grammar(fmt, req["tools"], "required", True, False, opened)
    assert none is not None and grammar_accepts(none, case["input"]) is not None
    # one block only, and text outside it before the call stays refused
    call = case["input"][case["input"].index("<|tool_call>") :]
    thought = case["input"][: len(case["input"]) - len(call)]
    for text in (thought + thought + call, "Let me check." + call, thought + "Now." + call):
        assert grammar_accepts(_grammar(case, opened), text) is not None, text
