"""The reasoning budget against llama.cpp's own test of its sampler
(tests/test-reasoning-budget.cpp of the sdist): each case feeds a token sequence and says at
which step forcing starts and through which it lasts; its UTF-8 boundary cases; and the
budget, a request's own field (`Request.reasoning_budget`), through `Constraint` on a logits
row."""

from __future__ import annotations

import pytest
import torch

from loraserve.engine.budget import BudgetSpec, ReasoningBudget, utf8_complete
from loraserve.engine.constraint import Constraint

NEVER = None
# (name, sequence, starts, ends, forced, budget, counting, force_start, force_end)
CASES = [
    ("natural end before budget exhausted", [100, 50, 51, 101, 52], [[100]], [[101]], [102],
     5, False, NEVER, NEVER),
    ("budget exhausted forcing", [100, 50, 51, 52, 53], [[100]], [[101]], [102, 101],
     2, False, 3, 4),
    ("activate immediately budget=0", [100, 50, 51, 52], [[100]], [[101]], [102, 101],
     0, True, 0, 1),
    ("activate immediately with budget", [50, 51, 52, 53], [[100]], [[101]], [102, 101],
     2, True, 2, 3),
    ("multi-block re-arms budget after DONE", [100, 50, 101, 100, 60, 61, 62, 63], [[100]],
     [[101]], [102, 101], 2, False, 6, 7),
    ("multiple start sequences", [110, 111, 50, 51, 52, 53], [[100], [110, 111]], [[101]],
     [102, 101], 2, False, 4, 5),
    ("multiple end sequences", [100, 50, 103, 104, 52], [[100]], [[101], [103, 104]],
     [102, 101], 5, False, NEVER, NEVER),
]  # fmt: skip


def _spec(starts, ends, forced, budget, counting) -> BudgetSpec:  # noqa: ANN001
    return BudgetSpec(budget, tuple(map(tuple, starts)), tuple(map(tuple, ends)),
                      tuple(forced), counting)  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forcing_steps_equal_llama_cpps(case) -> None:
    _, seq, starts, ends, forced, budget, counting, want_start, want_end = case
    b = ReasoningBudget(_spec(starts, ends, forced, budget, counting), lambda t: b"x")
    first = last = None
    for i, tok in enumerate(seq):  # as the C++ test: apply, then accept the sequence's token
        if b.forced is not None:
            first = i if first is None else first
            last = i
        elif first is not None:
            break
        b.accept(tok)
    assert first == want_start
    if want_end is not None:
        assert last is not None and last >= want_end


def test_waits_for_a_whole_utf8_character() -> None:
    """A budget spent on a token that ends inside a character forces only after a token
    that ends on a whole one (the C++ test has no vocabulary; this is its WAITING_UTF8
    state, which checks each token's own bytes)."""
    pieces = {1: b"a", 2: "é".encode()[:1], 3: b"x"}
    b = ReasoningBudget(_spec([[100]], [[101]], [102], 2, True), pieces.__getitem__)
    b.accept(1)
    b.accept(2)  # budget spent, the character unfinished
    assert b.forced is None
    b.accept(3)
    assert b.forced == 102


@pytest.mark.parametrize(
    "piece,complete",
    [(b"hello", True), (b"", True), (b"\xc2\xa0", True), (b"\xe2\x80\x9c", True),
     (b"\xf0\x9f\x98\x80", True), (b"abc\xc3\xa9", True), (b"\xc2", False),
     (b"\xe2\x80", False), (b"\xe2", False), (b"\xf0\x9f\x98", False), (b"\xf0\x9f", False),
     (b"\xf0", False), (b"\x80", False), (b"hello\xc3", False), (b"hello\xc3\xa9", True)],
)  # fmt: skip
def test_utf8_boundaries_equal_llama_cpps(piece: bytes, complete: bool) -> None:
    assert utf8_complete(piece) is complete


class _Grammars:
    """What `Constraint` reads of `Grammars` when a request has a budget and no grammar."""

    class _LL:
        vocab_size = 8

    lltok = _LL()

    class tok:  # noqa: N801
        @staticmethod
        def token_bytes(t: int) -> bytes:
            return b"t"


def test_constraint_forces_the_end_marker_then_lets_go() -> None:
    spec = _spec([[1]], [[2]], [3, 2], 1, False)
    c = Constraint(_Grammars(), None, spec)  # type: ignore[arg-type]
    row = torch.arange(8, dtype=torch.float32)
    for tok in (1, 5):  # the start marker, then one token: the budget is spent
        c.mask(r := row.clone())
        assert torch.equal(r, row)
        assert c.accept(tok)
    for forced in (3, 2):
        c.mask(r := row.clone())
        assert r[forced] == row[forced] and torch.isinf(r).sum() == 7
        assert c.accept(forced)
    c.mask(r := row.clone())
    assert torch.equal(r, row) and not c.finished
