"""The default reasoning budget of a forced call (issue 26 item 4, **ours**).

Under `tool_choice` required or a named function a reasoning block may come before the call
(as llama.cpp's grammar `reasoning? content? calls`), so with no budget a small model could
reason until `max_tokens` and return no call (llama-server's `required` does). Where neither
the request nor the server sets a budget, `plan_reply` gives the block half the answer's
token allowance (`max_tokens`, else the context left after the prompt, the smaller of the
two), so the call keeps the other half. An explicit budget (request or `--reasoning-budget`,
0 included) wins; `auto`, `reasoning_format: none` and a prompt that closed the block
(thinking off) get none. On the old code a forced call had no budget (plan.budget None).
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from loraserve.chat.formats.budget import forced_call_budget
from loraserve.chat.render import RenderInputs, Tokens, render
from loraserve.server import tool_calls
from loraserve.server.reasoning_budget import reasoning_budget
from loraserve.server.tool_calls import plan_reply
from tests.unit.chat.format_util import TEMPLATES
from tests.unit.chat.oracle_util import template_format

QWEN3 = "Qwen-Qwen3-0.6B.jinja"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
USER = [{"role": "user", "content": "Weather in Paris?"}]
N_CTX = 4096  # a slot's context


class _Bytes:
    """A tokenizer whose tokens are the text's bytes (special tokens spelled as text)."""

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list:
        return list(text.encode())


def _state(server_budget: int = -1) -> Any:
    engine = SimpleNamespace(tokenizer=_Bytes(), n_ctx_slot=N_CTX, compile_grammar=lambda s: s)
    cfg = SimpleNamespace(reasoning_format="auto", skip_chat_parsing=False,
                          reasoning_budget=server_budget, reasoning_budget_message="")  # fmt: skip
    return SimpleNamespace(cfg=cfg, require=lambda: engine)


def _prompt(think: bool = True, prefill: bool = False) -> str:
    msgs = [*USER, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]
    inp = RenderInputs(msgs if prefill else USER, tools=TOOLS, add_generation_prompt=not prefill,
                       enable_thinking=think)  # fmt: skip
    text = render((TEMPLATES / QWEN3).read_text(), Tokens("<s>", "</s>"), inp)
    if prefill:  # the continued assistant turn, its reasoning left open
        text = text[: text.rindex("</think>")]
    return text


def _budget(monkeypatch: pytest.MonkeyPatch, choice: str = "required", prompt: str = "",
            server: int = -1, rf: str | None = None, **body: Any) -> int | None:  # fmt: skip
    """The budget tokens of the plan of a Qwen3 request (None: no budget)."""
    logging.disable(logging.WARNING)
    fmt = template_format(QWEN3)
    logging.disable(logging.NOTSET)
    monkeypatch.setattr(tool_calls, "chat_format", lambda state, tools: fmt)
    state = _state(server)
    body = {"n_predict": -1, "reasoning_budget_tokens": None, **body}
    budget = reasoning_budget(state.cfg, SimpleNamespace(**body))
    plan = asyncio.run(plan_reply(state, prompt or _prompt(), TOOLS, choice, True, rf,
                                  budget=budget))  # fmt: skip
    return None if plan.budget is None else plan.budget.budget


def test_the_rule() -> None:
    assert forced_call_budget(480, 1000) == 240
    assert forced_call_budget(-1, 1000) == 500  # no max_tokens: the context left
    assert forced_call_budget(5000, 1000) == 500  # the context bounds it first
    assert forced_call_budget(1, 1000) == 0 and forced_call_budget(-1, -3) == 0


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_a_forced_call_gets_half_the_allowance(monkeypatch, choice) -> None:
    assert _budget(monkeypatch, choice, n_predict=480) == 240
    left = N_CTX - len(_prompt().encode())
    assert _budget(monkeypatch, choice) == left // 2  # no max_tokens
    assert _budget(monkeypatch, choice, n_predict=100_000) == left // 2
    # the rest of a block the prompt opened (a reasoning prefill) counts against it too
    assert _budget(monkeypatch, choice, _prompt(prefill=True), n_predict=64) == 32


def test_an_explicit_budget_wins(monkeypatch) -> None:
    assert _budget(monkeypatch, n_predict=480, reasoning_budget_tokens=0) == 0
    assert _budget(monkeypatch, n_predict=480, reasoning_budget_tokens=8) == 8
    assert _budget(monkeypatch, n_predict=480, server=5) == 5
    assert _budget(monkeypatch, n_predict=480, server=0) == 0
    assert _budget(monkeypatch, n_predict=480, server=5, reasoning_budget_tokens=-1) == 5


def test_no_default_where_no_block_comes_first(monkeypatch) -> None:
    assert _budget(monkeypatch, "auto", n_predict=480) is None  # not forced
    assert _budget(monkeypatch, rf="none", n_predict=480) is None  # no reasoning rule
    off = _prompt(think=False)  # Qwen3's `<think>\n\n</think>`: thinking off
    assert "</think>" in off and _budget(monkeypatch, prompt=off, n_predict=480) is None
