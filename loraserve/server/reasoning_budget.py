"""A chat request's reasoning budget: read from the request and the server's flags as
llama-server reads them, and turned into the engine's `BudgetSpec` (the format's start and
end markers as tokens, the forced end after the budget's message)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraserve.chat.formats.budget import budget_markers
from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.lead import opens_reasoning
from loraserve.engine.budget import BudgetSpec
from loraserve.model.tokenizer import Tokenizer

__all__ = ["Budget", "budget_spec", "reasoning_budget"]


@dataclass(frozen=True)
class Budget:
    """A request's reasoning budget: tokens (-1: none) and the message written before the
    forced end marker ("" : none); `allowance`: the answer's max tokens (-1: none), which a
    forced call's default budget is half of (`forced_call_budget`)."""

    tokens: int = -1
    message: str = ""
    allowance: int = -1


def reasoning_budget(cfg: Any, body: Any) -> Budget:
    """The request's reasoning budget, as llama-server reads it: `reasoning_budget_tokens`
    (else `thinking_budget_tokens`, else `--reasoning-budget`; -1: none) and
    `reasoning_budget_message` (else `--reasoning-budget-message`); with the answer's
    `n_predict` (`max_tokens`, `max_completion_tokens`, else `-n`) as its allowance."""
    budget = getattr(body, "reasoning_budget_tokens", None)
    if budget is None:
        budget = getattr(body, "thinking_budget_tokens", None)
    if budget is None or budget == -1:
        budget = getattr(cfg, "reasoning_budget", -1)
    message = getattr(body, "reasoning_budget_message", None)
    if message is None:
        message = getattr(cfg, "reasoning_budget_message", "") or ""
    allowance = getattr(body, "n_predict", None)
    allowance = -1 if allowance is None else int(allowance)
    return Budget(-1 if budget is None else int(budget), message, allowance)


def budget_spec(tok: Tokenizer, fmt: ChatFormat, prompt: str, budget: Budget) -> BudgetSpec | None:
    """The budget's markers (`chat.formats.budget`) as tokens: the reasoning start arms it,
    an end marker ends it, and the first end marker, after the budget's message, is forced
    when it is spent (llama-server's thinking_start_tag / thinking_end_tags /
    reasoning_budget_message)."""
    markers = budget_markers(fmt)
    if budget.tokens < 0 or markers is None:
        return None

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special=False, parse_special=True))

    fragment = getattr(tok, "_encode_fragment", None)  # tokenizer internals

    def spellings(text: str) -> list[tuple[int, ...]]:
        """The marker's tokens, and (SentencePiece) without the dummy space prefix: the
        model writes a marker inside its answer, not at a text's start."""
        out = [ids(text)]
        if fragment is not None:
            out.append(tuple(fragment(text, False)))
        return out

    end_seqs = [s for e in markers.ends for s in spellings(e)]
    forced = (ids(budget.message) if budget.message else ()) + ids(markers.ends[0])
    starts = tuple(dict.fromkeys(spellings(markers.start)))
    by_text = all(len(s) > 1 for s in starts)  # no single token: the grammar's text marker
    return BudgetSpec(budget.tokens, starts, tuple(dict.fromkeys(end_seqs)), forced,
                      opens_reasoning(fmt, prompt), by_text)  # fmt: skip
