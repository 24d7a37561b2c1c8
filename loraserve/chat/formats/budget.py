"""The reasoning budget's markers for a format (`--reasoning-budget`, `reasoning_budget_tokens`):
the text that opens a reasoning block, arming the budget, and the texts that end one, the
first of which is forced when the budget is spent (`engine.budget`).

llama-server reads them from the format as `thinking_start_tag` / `thinking_end_tags`
(server-common.cpp: no end tags, no budget). Ours are the same for every template
llama.cpp gives them (tests/unit/chat/test_budget_markers.py, over the 70 templates'
recorded answers), plus the format's own end spellings and the markers that also end its
reasoning (a call's start), so a call written inside reasoning is never cut by a forced end
marker; the one forced is llama.cpp's first (Qwen3's `</think>`, Qwen3.5's `\n</think>`).
Beyond llama-server: Muse Glimmer, whose reasoning is a ` to=self` message ended by
`<|eom|>` and for which llama.cpp sets no tags, gets a budget too, so under `required` a
model that never ends its reasoning message still reaches the call.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.lead import MUSE_EOM, MUSE_SELF


@dataclass(frozen=True)
class BudgetMarkers:
    """Where a format's reasoning starts and ends, as text."""

    start: str  # opens a reasoning block (the budget arms after it)
    ends: tuple[str, ...]  # end it; `ends[0]` is forced when the budget is spent


def budget_markers(fmt: ChatFormat) -> BudgetMarkers | None:
    """The reasoning budget's markers for `fmt`, or None where it has no reasoning block
    with an end marker."""
    if fmt.dialect == "muse_glimmer":  # a reasoning message: ` to=self<|message|>..<|eom|>`
        return BudgetMarkers(MUSE_SELF, (MUSE_EOM,))
    start, end = fmt.reasoning_start.strip(), fmt.reasoning_end.rstrip()
    if not start or not end.strip():
        return None
    # llama.cpp's end tags first (its first is the one forced), then our own spellings
    theirs = fmt.thinking_end_tags or (end.strip(),)
    ends = (*theirs, end, end.strip(), *(m.strip() for m in fmt.reasoning_stops))
    return BudgetMarkers(start, tuple(dict.fromkeys(e for e in ends if e)))


def forced_call_budget(allowance: int, context_left: int) -> int:
    """The reasoning budget of a forced call (`tool_choice` required or a named function,
    a reasoning block allowed before it) where neither the request nor the server sets one
    (**ours**; llama-server's `required` lets a model reason until its tokens run out with
    no call): half the answer's token allowance, its `max_tokens` (`allowance`; -1: none)
    or else the context left after the prompt, the smaller of the two when both bound it,
    so the call keeps the other half."""
    room = context_left if allowance < 0 else min(allowance, context_left)
    return max(room, 0) // 2
