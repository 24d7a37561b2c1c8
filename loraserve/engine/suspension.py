"""Preemption's two moves on the scheduler's state (`engine/preemption.py` decides when):
`suspend` takes a running sequence out of its slot, `resume` seats it again.

Split from `scheduler.py`; both act on the `Scheduler`'s slots, waiting queue and cache
through its own helpers (`_retire`, `_take`, `_release_slot`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from loraserve.engine.request import Run
from loraserve.engine.slot import Slot

if TYPE_CHECKING:
    from loraserve.engine.scheduler import Scheduler

log = logging.getLogger("loraserve.engine")


def suspend(sched: Scheduler, run: Run) -> None:
    """Preempt ``run``: its KV to the prefix cache (its slot retains it, as a finished
    run's), its request back to the waiting queue."""
    pre = sched.preemption
    run.draft.clear()
    pre.catchup.pop(run.req.id, None)
    slot = run.slot
    sched._retire(run)
    pre.suspended[run.req.id] = run
    pre.n_preempted += 1
    sched.waiting.append(run.req)
    pre.queued(run.req)
    log.info(
        "request %d preempted from slot %d after %d generated tokens: a request waited over %g s",
        run.req.id,
        slot,
        len(run.generated),
        pre.after_s,
    )


def resume(sched: Scheduler, slot: Slot, run: Run) -> Run:
    """A preempted run takes ``slot``: its cached prefix back, and what the cache lost
    recomputed (`catchup`) up to its last sampled token, which decodes next."""
    limit = len(run.tokens) - 1
    m = sched.cache.match(run.req.cache_key, run.tokens, limit)
    blocks = sched._take(m)
    sched._release_slot(slot)
    run.blocks, run.n_computed, run.slot = blocks, m.n_tokens, slot.id
    if run.generated and run.n_computed < limit:
        sched.preemption.catchup[run.req.id] = limit
    slot.run, slot.last_request = run, run.req
    return run
