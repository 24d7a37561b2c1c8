"""Preemption for fairness (ours: llama-server has none): a request that has waited
`after_s` seconds for a slot while every slot is busy takes one from a running request
that has held its slot at least as long.

The victim is a generation request (not an embedding, not speculating, not on a recurrent
model: those keep state a resume would not restore exactly): the run of the client holding
the most slots, then the one that has held its slot longest. It keeps everything but its
KV: its tokens, sampler (random state included), grammar state, text output and timings
stay in its `Run`; its KV goes to the prefix cache under its own cache key (as a finished
request's does) and its request goes back to the waiting queue.
When it is admitted again it resumes: the longest cached prefix of its tokens is taken
back, the rest recomputed as a prefill without logits (`catchup`), and decoding goes on
from its last sampled token. Prefill computes exactly what decode computed (row-independent
kernels), so the resumed request's logits, tokens and events are bit-identical to an
uninterrupted run's, and its client sees no token twice nor any lost: tokens are only
ever sent when sampled, and a suspended run samples nothing.

`after_s` is also each run's quantum: a run resumed (or admitted) is not preempted again
before it has held its slot that long and sampled a token in it, so slots are time-sliced,
and every run makes progress however small the bound (no livelock of recomputations).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from loraserve.engine.request import Request, Run


@dataclass
class Preemption:
    """What the scheduler needs to preempt and resume runs (``after_s`` 0: never)."""

    after_s: float = 0.0
    suspended: dict[int, Run] = field(default_factory=dict)  # request id -> its run, no KV
    catchup: dict[int, int] = field(default_factory=dict)  # request id -> n_computed to reach
    since: dict[int, float] = field(default_factory=dict)  # slot id -> when its run got it
    mark: dict[int, int] = field(default_factory=dict)  # slot id -> tokens its run had then
    queued_at: dict[int, float] = field(default_factory=dict)  # request id -> when it queued
    n_preempted: int = 0  # runs preempted so far

    def seated(self, slot: int, run: Run) -> None:
        """``run`` just took ``slot`` (admitted, or resumed)."""
        self.since[slot] = time.monotonic()
        self.mark[slot] = len(run.generated)

    def queued(self, req: Request) -> None:
        """``req`` joined the waiting queue (submitted, or preempted)."""
        self.queued_at[req.id] = time.monotonic()

    def left_queue(self, req: Request) -> None:
        """``req`` left the waiting queue (admitted or dropped)."""
        self.queued_at.pop(req.id, None)

    def starving(self, waiting: Iterable[Request], now: float) -> Request | None:
        """The longest-waiting request, if it has waited past the bound."""
        if self.after_s <= 0:
            return None
        free = [r for r in waiting if r.id_slot < 0]  # a pinned one waits for its own slot
        oldest = min(free, key=lambda r: self.queued_at.get(r.id, now), default=None)
        if oldest is None or now - self.queued_at.get(oldest.id, now) < self.after_s:
            return None
        return oldest

    def victim(self, runs: list[Run], recurrent: bool, now: float) -> Run | None:
        """The run to preempt, if any may be: see the module docstring."""
        if recurrent:
            return None
        held = Counter(r.req.client for r in runs)
        able = [
            r
            for r in runs
            if r.pooler is None
            and r.spec is None  # speculating: its drafts' state is not kept across a resume
            and not r.req.cancelled
            and now - self.since.get(r.slot, now) >= self.after_s
            and len(r.generated) > self.mark.get(r.slot, len(r.generated))
        ]
        if not able:
            return None
        return max(able, key=lambda r: (held[r.req.client], -self.since.get(r.slot, now)))
