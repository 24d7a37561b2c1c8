"""Tool-call grammars against llama.cpp's parse cases. gpt-oss's grammars against llama.cpp's
own gpt-oss cases (tests/data/chat/parse_cases.json): under `required`, a named function and
`auto`, each whole call after the generation prompt is accepted from its start (the
recipient in the role header or the channel's, commentary or analysis, with or without
`<|constrain|>json`, after an analysis message or not), and llama.cpp parses the same text
to the same call; under `auto` every answer without a call is accepted too; a call of
another function than the named one (under `auto`: of no tool), or arguments outside the
schema, is refused. Markers that are special tokens are token
references (Qwen's `<tool_call>`), under `auto` and `required`."""

from __future__ import annotations

import json

import pytest

from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.parse import ChatParser
from tests.unit.chat.format_util import grammar_accepts
from tests.unit.chat.oracle_util import CASES, template_format

HARMONY = "openai-gpt-oss-120b.jinja"
SPECIALS = ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>")
CALLS = [
    c for c in CASES
    if c["template"] == HARMONY and c["expect"]["tool_calls"] and not c["is_partial"]
]  # fmt: skip
TEXTS = [
    c for c in CASES
    if c["template"] == HARMONY and not c["expect"]["tool_calls"] and not c["is_partial"]
    and c["request"]["continue_final_message"] == "none"  # the answer from the turn's start
]  # fmt: skip


def _special(marker: str) -> bool:
    return marker in SPECIALS


@pytest.mark.parametrize("case", CALLS, ids=[str(c["id"]) for c in CALLS])
def test_accepts_llama_cpps_calls(case: dict) -> None:
    fmt, tools = template_format(HARMONY), case["request"]["tools"]
    (want,) = case["expect"]["tool_calls"]
    for choice in ("required", want["name"], "auto"):
        lark = tool_grammar(fmt, tools, choice, special=_special)
        assert lark is not None
        assert grammar_accepts(lark, case["input"], SPECIALS) is None, lark
    (call,) = ChatParser(fmt, tools).parse(case["input"], partial=False).tool_calls
    assert (call.name, json.loads(call.arguments)) == (want["name"], json.loads(want["arguments"]))


@pytest.mark.parametrize("case", TEXTS, ids=[str(c["id"]) for c in TEXTS])
def test_auto_leaves_answers_without_calls_free(case: dict) -> None:
    tools = case["request"]["tools"] or CALLS[0]["request"]["tools"]
    lark = tool_grammar(template_format(HARMONY), tools, "auto", special=_special)
    assert lark is not None
    assert grammar_accepts(lark, case["input"], SPECIALS) is None, lark


def test_refuses_other_functions_and_bad_arguments() -> None:
    case = CALLS[0]
    fmt, tools = template_format(HARMONY), case["request"]["tools"]
    other = [*tools, {"type": "function", "function": {"name": "other", "parameters": {}}}]
    lark = tool_grammar(fmt, other, "other", special=_special)
    assert lark is not None and grammar_accepts(lark, case["input"], SPECIALS) is not None
    bad = case["input"].replace('{"arg1": 1}', '{"arg1": "x"}')
    other_call = case["input"].replace("special_function", "other")
    for choice in ("required", "auto"):
        lark = tool_grammar(fmt, tools, choice, special=_special)
        assert bad != case["input"] and grammar_accepts(lark, bad, SPECIALS) is not None
        assert grammar_accepts(lark, other_call, SPECIALS) is not None


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_special_markers_are_token_references(choice: str) -> None:
    """Qwen3's `<tool_call>` markers as single special tokens (llguidance names a `<..>`
    token by its text): llama.cpp's Qwen3 call case is accepted from its trigger on, and
    under auto with free text before it; the markers spelled as text are refused."""
    name = "Qwen-Qwen2.5-7B-Instruct.jinja"
    case = next(c for c in CASES if c["template"] == name and c["expect"]["tool_calls"]
                and not c["is_partial"] and len(c["expect"]["tool_calls"]) == 1)  # fmt: skip
    fmt, tools = template_format(name), case["request"]["tools"]
    specials = ("<tool_call>", "</tool_call>")
    lark = tool_grammar(fmt, tools, choice, special=lambda m: m in specials)
    assert lark is not None and "<tool_call>" in lark and '"<tool_call>' not in lark
    text = case["input"][case["input"].index("<tool_call>") :]
    text = ("Sure. " if choice == "auto" else "") + text
    assert grammar_accepts(lark, text, specials) is None, (text, lark)
    assert grammar_accepts(lark, text) is not None  # the markers as text


PATTERN_TRIGGERED = [
    ("muse-glimmer.jinja", ' to=user<|message|>Hi.<|eom|><|start|>assistant to=special_function'
     '<|message|><atem:function_calls>\n<atem:invoke name="special_function">\n<atem:parameter'
     ' name="arg1">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>'),
    ("meetkai-functionary-medium-v3.2.jinja", 'all\nHi.>>>special_function\n{"arg1": 1}'),
]  # fmt: skip


@pytest.mark.parametrize(("name", "answer"), PATTERN_TRIGGERED)
def test_pattern_triggered_auto_grammars_bind_the_calls(name: str, answer: str) -> None:
    """Muse's and Functionary's `auto` grammars: text first, then a call, is accepted; a
    call of no tool, or arguments outside the schema, is refused."""
    fmt, tools = template_format(name), CALLS[0]["request"]["tools"]
    specials = tuple(t for t in fmt.preserved_tokens if t.startswith("<|"))
    lark = tool_grammar(fmt, tools, "auto", special=lambda m: m in specials)
    assert lark is not None and grammar_accepts(lark, answer, specials) is None, lark
    for bad in (answer.replace("special_function", "other"), answer.replace("1", "x")):
        assert grammar_accepts(lark, bad, specials) is not None, bad


@pytest.mark.parametrize("case", CALLS, ids=[str(c["id"]) for c in CALLS])
def test_harmony_markers_as_text_still_bind_the_calls(case: dict) -> None:
    """A vocabulary without harmony's special tokens (the markers spelled as text): a
    message's text stops at its first `<|end|>`, so under `auto` and `required` the call
    after an analysis message is still held to the tools and the schema."""
    fmt, tools = template_format(HARMONY), case["request"]["tools"]
    (want,) = case["expect"]["tool_calls"]
    other = case["input"].replace(f"functions.{want['name']}", "functions.other")
    for choice in ("auto", "required"):
        lark = tool_grammar(fmt, tools, choice)
        assert lark is not None and grammar_accepts(lark, case["input"]) is None, lark
        assert other != case["input"] and grammar_accepts(lark, other) is not None


@pytest.mark.parametrize(("name", "answer"), PATTERN_TRIGGERED)
def test_pattern_triggered_auto_grammars_bind_calls_spelled_as_text(name: str, answer: str) -> None:
    """Muse's and Functionary's `auto` grammars with every marker spelled as text."""
    lark = tool_grammar(template_format(name), CALLS[0]["request"]["tools"], "auto")
    assert lark is not None and grammar_accepts(lark, answer) is None, lark
    for bad in (answer.replace("special_function", "other"), answer.replace("1", "x")):
        assert grammar_accepts(lark, bad) is not None, bad
