"""The per-step batch (`compose`, the scheduler's `schedule`): which rows of which running
sequences one forward pass computes, within the token budget. Decode rows first (one per
sequence, plus its speculative draft), then the recomputation of preempted sequences that
resumed (`engine/preemption.py`: a prefill without logits up to their last sampled token),
then prompt chunks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loraserve.engine.embedding import wanted_rows
from loraserve.engine.request import Run
from loraserve.engine.runner import BatchItem

if TYPE_CHECKING:
    from loraserve.engine.scheduler import Scheduler


def compose(sched: Scheduler) -> list[tuple[Run, BatchItem]]:
    """Decode tokens of running sequences, then prefill chunks, within the budget. A run
    whose item cannot be prepared (no block left for it) goes to `broken`, alone."""
    budget = sched.token_budget
    out: list[tuple[Run, BatchItem]] = []
    running = sched.running
    catchup = sched.preemption.catchup
    for run in running:
        if run.req.id in catchup and run.n_computed >= catchup[run.req.id]:
            del catchup[run.req.id]  # caught up: decodes from here
    for run in running:
        if run.req.id in catchup:
            run.draft.clear()  # a resumed run recomputes (below) before it drafts
        elif not run.prefilling and budget > 0:
            # a speculative draft rides along as extra rows of the decode item
            del run.draft[max(budget - 1, 0) :]
            if _add(sched, out, run, run.n_computed, 1 + len(run.draft), decode=True):
                budget -= 1 + len(run.draft)
    for run in running:  # a resumed run's recomputation, as a prefill without logits
        if run.req.id in catchup and budget > 0:
            n = min(catchup[run.req.id] - run.n_computed, budget)
            if _add(sched, out, run, run.n_computed, n):
                budget -= n
    for run in running:
        if run.prefilling and run.req.id not in catchup and budget > 0:
            n = min(run.n_prompt - run.n_computed, budget)
            if _add(sched, out, run, run.n_computed, n):
                budget -= n
    return out


def _add(
    sched: Scheduler, out: list[tuple[Run, BatchItem]], run: Run, start: int, n: int,
    decode: bool = False,
) -> bool:  # fmt: skip
    try:
        out.append((run, _item(sched, run, start, n, decode)))
    except Exception as e:  # this run fails alone
        sched.broken.append((run, f"internal error preparing the step: {_describe(e)}"))
        return False
    return True


def _item(sched: Scheduler, run: Run, start: int, n: int, decode: bool) -> BatchItem:
    need = (start + n + sched.bs - 1) // sched.bs
    while len(run.blocks) < need:
        run.blocks.append(sched.cache.allocate())
    pooling = run.req.pooling
    draft = run.draft if not run.prefilling else []
    return BatchItem(
        tokens=run.tokens + draft if draft else run.tokens,
        start=start,
        n=n,
        blocks=run.blocks,
        want_logits=start + n == len(run.tokens) + len(draft) and pooling is None,
        n_logits=1 + len(draft),
        mix=run.req.mix.scales,
        mixes=run.req.mixes,
        hidden=None if pooling is None else wanted_rows(pooling, start, n, run.n_prompt),
        decode=decode,
    )


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
