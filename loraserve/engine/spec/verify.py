"""Verification of drafts: the tokens a sequence keeps are exactly those that decoding it
one token at a time would have produced, greedy or sampled, for any seed.

A sequence with draft ``d[0..k-1]`` ran ``1 + k`` rows in the step: its last sampled token,
then the draft. Row ``j``'s logits are those of the sequence after ``d[:j]`` (bitwise, by
the kernels' batch invariance), so the rows are sampled in order, each with the request's
own sampler state (penalty window, generator) advanced by the tokens before it: at depth
``j`` every sequence still verifying is sampled together, and a sequence goes on to depth
``j + 1`` only if the token it drew is ``d[j]`` (then row ``j + 1``'s input was right and its
KV is kept). Its first mismatch is its next token, as without a draft.

With temperature this is the standard rejection rule for a draft that proposes one token
with certainty (n-grams and a greedy draft model): the draft token is accepted with the
target's probability of it, and on rejection the token comes from the target's distribution
without it, so the output distribution is the target's. Drawing the target's token with the
request's own generator and comparing is that rule, and consumes one uniform per token kept,
as decoding without a draft does: a seed gives the same tokens with speculation on or off.

Rollback: the KV of rejected rows lies past ``n_computed`` in blocks the sequence owns (never
indexed, never shared); the blocks wholly past it return to the pool, so the block table
covers exactly the tokens whose KV is valid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from loraserve.engine.request import Run
from loraserve.engine.sampling.ops import fast_argmax

if TYPE_CHECKING:
    from loraserve.engine.core import EngineCore


def _rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """logits [S, V] -> [len(rows), V], no copy when rows are all of them in order."""
    if rows == list(range(logits.shape[0])):
        return logits
    return logits[torch.tensor(rows, dtype=torch.long)]


def _top(top: torch.Tensor | None, rows: list[int], logits: torch.Tensor) -> torch.Tensor | None:
    """The step's argmax [S] of ``rows`` (None where the step did not find it)."""
    if top is None or rows == list(range(logits.shape[0])):
        return top
    return top[torch.tensor(rows, dtype=torch.long)]


def verify(
    core: EngineCore,
    entries: list[tuple[Run, int]],
    logits: torch.Tensor,
    top: torch.Tensor | None = None,
) -> None:
    """Sample every entry (a run and its first logits row of ``logits`` [S, V]), verifying
    each run's `Run.draft` row by row; counters, back-off and rollback follow. ``top`` [S]:
    the rows' argmax when the step already found it (`StepOutcome.top`)."""
    for run, _ in entries:
        if run.draft:
            assert run.spec is not None
            run.timings.draft_n += len(run.draft)
            run.spec.n_drafted += len(run.draft)
            run.spec.n_verified += 1
    plain = [(r, f) for r, f in entries if r.draft and _plain_greedy(r)]
    live = [(r, f) for r, f in entries if not (r.draft and _plain_greedy(r))]
    if plain:
        _verify_greedy(core, plain, logits, top)
    depth = 0
    while live:
        rows = [f + depth for _, f in live]
        core._sample([r for r, _ in live], _rows(logits, rows), _top(top, rows, logits))
        going: list[tuple[Run, int]] = []
        for run, first in live:
            draft = run.draft
            running = _running(core, run)
            if running and depth < len(draft) and run.generated[-1] == draft[depth]:
                _kept(run)
                going.append((run, first))
            elif draft:
                _end(core, run, depth, running)
        live = going
        depth += 1


def _plain_greedy(run: Run) -> bool:
    """Greedy with nothing that depends on the tokens before a row (no penalties, bias,
    probabilities or grammar): every row's token is its argmax, all found at once."""
    return run.sampler is not None and run.sampler.plain_greedy and run.constraint is None


def _verify_greedy(
    core: EngineCore,
    entries: list[tuple[Run, int]],
    logits: torch.Tensor,
    top: torch.Tensor | None,
) -> None:
    """The same verification for plain greedy runs, with one argmax over every row (the
    step's own when given: these rows carry no mask, so it is theirs)."""
    best = (top if top is not None else fast_argmax(logits.contiguous())).tolist()  # [S]
    for run, first in entries:
        draft, depth = run.draft, 0
        while True:
            core._accept(run, best[first + depth], None)
            running = _running(core, run)
            if not (running and depth < len(draft) and run.generated[-1] == draft[depth]):
                break
            _kept(run)
            depth += 1
        _end(core, run, depth, running)


def _running(core: EngineCore, run: Run) -> bool:
    return core.scheduler.slots[run.slot].run is run


def _kept(run: Run) -> None:
    """The draft token at the current depth was the target's: its row's KV is kept."""
    run.n_computed += 1
    run.timings.draft_n_accepted += 1
    assert run.spec is not None
    run.spec.n_accepted += 1


def _end(core: EngineCore, run: Run, accepted: int, running: bool) -> None:
    """A draft's verification is over: learn from it, and roll back the rejected KV."""
    core.spec.record(run, len(run.draft), accepted)
    run.draft = []
    if not running:
        return  # finished: `Scheduler.finish` kept the blocks of its n_computed tokens
    keep = (run.n_computed + core.pool.block_size - 1) // core.pool.block_size
    extra = run.blocks[keep:]
    if extra:
        del run.blocks[keep:]
        core.cache.release(extra)
