"""The reasoning budget's markers for every template against llama.cpp's
(tests/data/chat/render_cases.json: `thinking_start_tag` / `thinking_end_tags`, which
llama-server hands its reasoning-budget sampler; no end tags, no budget there): the server's
budget (`reasoning_budget.budget_spec`) arms on llama.cpp's start tag and ends on each of its end
tags, forcing the first, for all 70 templates; a call's start that ends reasoning in
llama.cpp (DeepSeek V3.2/V4's DSML block, Ling 3's `<tool_call>`) ends the budget too
(before: only `</think>`, so a call written inside reasoning got `</think>` forced into it).
Muse Glimmer thinks (llama.cpp's supports_thinking) but llama.cpp sets it no tags: ours arms
on its ` to=self<|message|>` reasoning message and forces its `<|eom|>`, so a model that
never ends that message still reaches the answer (or, under `required`, the call)."""

from __future__ import annotations

import json
import logging

import pytest

from loraserve.engine.budget import FORCING, ReasoningBudget
from loraserve.server.reasoning_budget import Budget, budget_spec
from tests.unit.chat.format_util import DATA
from tests.unit.chat.oracle_util import template_format

ORACLE = json.loads((DATA / "render_cases.json").read_text())
CASE = next(
    i for i, c in enumerate(ORACLE["cases"])
    if c["fixture"] == "user" and c["tools"] == "two" and c["tool_choice"] == "auto"
    and c["enable_thinking"] and c["add_generation_prompt"]
    and not c["continue_final_message"] and c["reasoning_format"] == "deepseek"
)  # fmt: skip
NAMES = sorted(n for n, t in ORACLE["templates"].items()
               if "error" not in t["outputs"][t["out"][CASE]])  # fmt: skip
BEYOND = {"muse-glimmer.jinja"}  # thinks, but llama.cpp sets no budget tags


class _Bytes:
    """A tokenizer whose tokens are the text's bytes (special tokens spelled as text)."""

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list:
        return list(text.encode())


def _text(ids: tuple[int, ...]) -> str:
    return bytes(ids).decode()


def _theirs(name: str) -> dict:
    t = ORACLE["templates"][name]
    return t["outputs"][t["out"][CASE]]


def _spec(name: str, prompt: str = "", tokens: int = 4):  # noqa: ANN202 - BudgetSpec | None
    logging.disable(logging.WARNING)
    try:
        return budget_spec(_Bytes(), template_format(name), prompt, Budget(tokens))
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.parametrize("name", NAMES)
def test_budget_markers_are_llama_cpps(name: str) -> None:
    out, spec = _theirs(name), _spec(name)
    if name in BEYOND:
        assert out["supports_thinking"] and not out["thinking_end_tags"]
        assert spec is not None
        return
    if not out["thinking_end_tags"]:
        assert spec is None
        return
    assert spec is not None
    assert [_text(s) for s in spec.starts] == [out["thinking_start_tag"]]
    ends = {_text(s) for s in spec.ends}
    assert set(out["thinking_end_tags"]) <= ends, (out["thinking_end_tags"], ends)
    assert _text(spec.forced) == out["thinking_end_tags"][0]  # what llama-server forces


def test_every_budgeted_template_is_checked() -> None:
    have = [n for n in NAMES if _theirs(n)["thinking_end_tags"]]
    assert len(have) >= 40 and len(NAMES) == 69  # llama.cpp fails on Command R+'s tools


def _run(spec, text: str) -> str:  # noqa: ANN001 - BudgetSpec
    """What a model writing `text` token by token gets: its bytes, with forced tokens in
    place of its own while the budget forces."""
    b = ReasoningBudget(spec, lambda t: bytes([t]))
    out, it = [], iter(text.encode())
    while True:
        tok = b.forced if b.forced is not None else next(it, None)
        if tok is None:
            return bytes(out).decode(errors="replace")
        out.append(tok)
        b.accept(tok)


def test_muse_reasoning_message_is_ended_by_the_budget() -> None:
    spec = _spec("muse-glimmer.jinja", tokens=5)
    assert _run(spec, " to=self<|message|>Hmm, let me think more and more") == (
        " to=self<|message|>Hmm, <|eom|>let me think more and more"
    )
    # a reasoning prefill (llama.cpp's continuation) starts the answer inside the message
    opened = _spec("muse-glimmer.jinja", "<|start|>assistant to=self<|message|>Let me", 3)
    assert opened.counting and _run(opened, " think on") == " th<|eom|>ink on"
    # the answer's own message is not reasoning: nothing forced there
    assert _run(spec, " to=user<|message|>It is sunny in Paris") == (
        " to=user<|message|>It is sunny in Paris"
    )


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("deepseek-ai-DeepSeek-V3.2.jinja", "<｜DSML｜function_calls>"),
        ("deepseek-ai-DeepSeek-V4.jinja", "<｜DSML｜tool_calls>"),
        ("inclusionai-ling-3.0-flash.jinja", "<tool_call>"),
    ],
)
def test_a_call_inside_reasoning_ends_the_budget(name: str, call: str) -> None:
    """llama.cpp's end tags hold the call's start: a call written before `</think>` ends
    the reasoning, and nothing is forced into the call."""
    spec = _spec(name, tokens=30)
    text = f"<think>ok {call}{'x' * 40}"
    assert _run(spec, text) == text
    b = ReasoningBudget(spec, lambda t: bytes([t]))
    for t in text.encode():
        b.accept(t)
    assert b.state != FORCING
