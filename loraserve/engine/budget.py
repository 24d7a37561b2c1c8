"""The reasoning budget (`--reasoning-budget N`, `reasoning_budget_tokens`): after N tokens
inside a reasoning block the end marker is forced, as llama.cpp's reasoning-budget sampler
(common/reasoning-budget.cpp) does.

States, as llama.cpp's: IDLE (watching for the start marker's tokens) → COUNTING (N tokens
left; the end marker written by the model ends it) → WAITING_UTF8 (the budget is spent but
the last token left a UTF-8 character unfinished) → FORCING (only the forced tokens, one by
one: the budget message, then the first end marker) → DONE (free again; a new start marker
re-arms it). The prompt's tokens count as llama.cpp's prefill: a generation prompt that
opens the reasoning block starts the request in COUNTING (`counting`).

A budget travels as the request's own field (`Request.reasoning_budget`, set through
`Engine.submit`), beside its grammar; `engine.constraint.Constraint` keeps both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BudgetSpec:
    """A request's reasoning budget in tokens of the model's vocabulary."""

    budget: int
    starts: tuple[tuple[int, ...], ...]  # markers that open reasoning (its start marker)
    ends: tuple[tuple[int, ...], ...]  # markers that end reasoning (the first is forced)
    forced: tuple[int, ...]  # what is forced when the budget is spent
    counting: bool = False  # the prompt left the answer inside reasoning
    by_text: bool = False  # markers also matched by their text, in any tokenization


_LEADS = ((0x80, 0x00), (0xE0, 0xC0), (0xF0, 0xE0), (0xF8, 0xF0))  # (mask, value) by length


def utf8_complete(piece: bytes) -> bool:
    """Whether `piece` ends on a whole UTF-8 character (llama.cpp's common_utf8_is_complete)."""
    for back in range(1, min(4, len(piece)) + 1):
        b = piece[-back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back for the lead
            continue
        need = next((n for n, (m, v) in enumerate(_LEADS, 1) if b & m == v), 1)
        return back >= need
    return not piece


IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = range(5)


class _Matcher:
    """Whether a token sequence just ended with one of `seqs`, or its text with one of
    theirs with `by_text` (reset after a match). The text too where the vocabulary has no
    single token for a marker (the tiny test model): the grammar holds it as text, which
    the model may write in any tokenization, and a forced call's optional reasoning block
    opened so must still arm the budget (llama.cpp matches the token sequences only)."""

    def __init__(self, seqs: tuple[tuple[int, ...], ...], piece, by_text: bool) -> None:  # noqa: ANN001
        self.seqs = [s for s in seqs if s]
        self.n = max((len(s) for s in self.seqs), default=0)
        self.recent: list[int] = []
        self.piece = piece
        texts = {b"".join(piece(t) for t in s) for s in self.seqs} if by_text else set()
        self.texts = [t for t in texts if t]
        self.m = max((len(t) for t in self.texts), default=0)
        self.tail = b""

    def advance(self, token: int) -> bool:
        self.recent = (self.recent + [token])[-self.n :] if self.n else []
        self.tail = (self.tail + self.piece(token))[-self.m :] if self.m else b""
        if any(tuple(self.recent[-len(s) :]) == s for s in self.seqs) or any(
            self.tail.endswith(t) for t in self.texts
        ):
            self.reset()
            return True
        return False

    def reset(self) -> None:
        self.recent, self.tail = [], b""


class ReasoningBudget:
    """One request's budget state (engine thread); `piece(token)` gives a token's bytes."""

    def __init__(self, spec: BudgetSpec, piece) -> None:  # noqa: ANN001 - Callable[[int], bytes]
        self.spec = spec
        self.piece = piece
        self.starts = _Matcher(spec.starts, piece, spec.by_text)
        self.ends = _Matcher(spec.ends, piece, spec.by_text)
        self.state = IDLE
        self.remaining = spec.budget
        self.pos = 0
        if spec.counting:
            self._arm()

    def _arm(self) -> None:
        self.state, self.remaining = COUNTING, self.spec.budget
        self.ends.reset()
        if self.remaining <= 0:
            self.state, self.pos = FORCING, 0

    @property
    def forced(self) -> int | None:
        """The one token allowed next, or None when the budget constrains nothing now."""
        if self.state == FORCING and self.pos < len(self.spec.forced):
            return self.spec.forced[self.pos]
        return None

    def accept(self, token: int) -> None:
        """Advance past a generated token."""
        if self.state in (IDLE, DONE):
            if self.starts.advance(token):
                self._arm()
        elif self.state in (COUNTING, WAITING_UTF8):
            if self.ends.advance(token):
                self.state = DONE
                return
            complete = utf8_complete(self.piece(token))
            if self.state == WAITING_UTF8:
                if complete:
                    self.state, self.pos = FORCING, 0
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    self.state = FORCING if complete else WAITING_UTF8
                    self.pos = 0
                    self.ends.reset()
        elif self.state == FORCING:
            self.pos += 1
            if self.pos >= len(self.spec.forced):
                self.state = DONE
