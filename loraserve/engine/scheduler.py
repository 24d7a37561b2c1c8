"""Slots, admission with prefix reuse, preemption (`preemption`: a request that waited too
long takes a slot; the preempted one resumes later) and the per-step batch (`step_plan`).

One owner per state: the scheduler owns the waiting queue and the slots (each slot's
running sequence, or the blocks it retains from its last one); blocks' reference
counts belong to the pool, the index to the prefix cache.
"""

from __future__ import annotations

import time
from collections import Counter, deque

from loraserve.cache.prefix_cache import Match, PrefixCache
from loraserve.engine.admission import QueueBudget, fair_order
from loraserve.engine.preemption import Preemption
from loraserve.engine.request import Request, Run
from loraserve.engine.runner import BatchItem
from loraserve.engine.slot import Slot
from loraserve.engine.step_plan import compose
from loraserve.engine.suspension import resume, suspend


class Scheduler:
    """Admits requests into slots and composes each step within the token budget."""

    def __init__(
        self,
        n_slots: int,
        n_ctx_slot: int,
        token_budget: int,
        cache: PrefixCache,
        max_queue: int = 0,
        preempt_after_s: float = 0.0,
    ):
        self.slots = [Slot(i) for i in range(n_slots)]
        self.n_ctx_slot = n_ctx_slot
        self.token_budget = token_budget
        self.cache = cache
        self.bs = cache.bs
        self.waiting: deque[Request] = deque()
        self.copies: list[tuple[int, int, int]] = []  # (src, dst, n) copy-on-write for runner
        self.queue = QueueBudget(max_queue)  # requests submitted, not yet in a slot
        self._served: dict[str, int] = {}  # client -> turn of its last admission (fairness)
        self._turn = 0
        # requests whose admission raised, and runs whose step could not be prepared, with
        # the error: the engine fails each one alone (`take_failures`)
        self.refused: list[tuple[Request, str]] = []
        self.broken: list[tuple[Run, str]] = []
        self.preemption = Preemption(preempt_after_s)  # `engine/preemption.py`
        self.dropped: list[Run] = []  # suspended runs whose request was cancelled meanwhile

    @property
    def running(self) -> list[Run]:
        return [s.run for s in self.slots if s.run is not None]

    def add(self, req: Request) -> None:
        self.waiting.append(req)
        self.preemption.queued(req)

    def _pick_slot(self, req: Request) -> Slot | None:
        if req.id_slot >= 0:
            s = self.slots[req.id_slot]
            return None if s.busy else s
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None

        def score(s: Slot) -> tuple[int, float]:
            n = 0
            if s.cache_key == req.cache_key:
                for a, b in zip(s.tokens, req.prompt, strict=False):
                    if a != b:
                        break
                    n += 1
            return (n, -s.last_used)

        return max(idle, key=score)

    def admit(self) -> list[Run]:
        """Move waiting requests into idle slots, fairly between clients (`fair_order`); a
        request pinned to a busy slot waits, and so does one whose `leader` is queued or
        still computing the shared prompt. Cancelled requests are dropped. A request whose
        admission raises goes to `refused` (failed alone by the engine); the waiting queue
        stays whole whatever happens."""
        pre = self.preemption
        live = [r for r in self.waiting if not r.cancelled]
        for r in self.waiting:
            if r.cancelled:
                self.queue.release(r)
                pre.left_queue(r)
                if r.id in pre.suspended:
                    self.dropped.append(pre.suspended.pop(r.id))
        self.waiting = deque(live)
        admitted = self._admit(live, set())
        now = time.monotonic()
        if self.waiting and all(s.busy for s in self.slots) and pre.starving(self.waiting, now):
            run = pre.victim(self.running, self.cache.states is not None, now)
            if run is not None:
                suspend(self, run)
                admitted += self._admit(list(self.waiting), {run.req.id})
        return admitted

    def _admit(self, live: list[Request], later: set[int]) -> list[Run]:
        """`admit` over ``live`` (the waiting requests), those in ``later`` left waiting."""
        admitted: list[Run] = []
        if not live or all(s.busy for s in self.slots):
            return admitted
        pending = {r.id for r in live}
        held = Counter(run.req.client for run in self.running)
        active = held.keys() | {r.client for r in live}
        self._served = {c: t for c, t in self._served.items() if c in active}  # bounded
        for req in fair_order(live, held, self._served):
            if all(s.busy for s in self.slots):
                break
            if req.id in later:
                continue
            lead = self._leader_run(req, pending)
            slot = None if lead is False else self._pick_slot(req)
            if slot is None:
                continue
            pending.discard(req.id)
            self.queue.release(req)
            self.preemption.left_queue(req)
            try:
                admitted.append(self._start(slot, req, lead or None))
            except Exception as e:  # this request fails alone, the queue goes on
                self.refused.append((req, f"internal error at admission: {_describe(e)}"))
            else:
                held[req.client] += 1
                self._turn += 1
                self._served[req.client] = self._turn
        self.waiting = deque(r for r in live if r.id in pending)
        return admitted

    def take_failures(self) -> tuple[list[tuple[Request, str]], list[tuple[Run, str]]]:
        """The requests refused at admission and the runs broken while scheduling, since the
        last call (the engine sends each its error)."""
        out = (self.refused, self.broken)
        self.refused, self.broken = [], []
        return out

    def _leader_run(self, req: Request, pending: set[int]) -> Run | None | bool:
        """For a request that shares its leader's prompt (`n` > 1): False while the leader
        waits or computes the prompt's KV, then its `Run` to share from; None when there is
        none to share (no leader, or it already finished: its KV is in the prefix cache)."""
        lead = req.leader
        if lead is None or self.cache.states is not None:  # recurrent: no state mid-block
            return None
        if lead.id in pending:
            return False
        run = next((r for r in self.running if r.req is lead), None)
        if run is None or run.req.cache_key != req.cache_key:
            return None
        return run if run.n_computed >= len(req.prompt) - 1 else False

    def _share(self, lead: Run, n: int) -> Match:
        """The leader's first ``n`` tokens of KV as a match: full blocks shared (the leader
        never writes them again), the partial one copied."""
        k, rem = divmod(n, self.bs)
        partial = lead.blocks[k] if rem else None
        return Match(list(lead.blocks[:k]), partial, rem, n)

    def _start(self, slot: Slot, req: Request, lead: Run | None = None) -> Run:
        if req.id in self.preemption.suspended:
            run = resume(self, slot, self.preemption.suspended.pop(req.id))
            self.preemption.seated(slot.id, run)
            return run
        run = Run(req=req, slot=slot.id, tokens=list(req.prompt), n_prompt=len(req.prompt))
        limit = len(req.prompt) - 1 if req.cache_prompt or lead is not None else 0
        if lead is not None and limit > 0:
            m: Match | None = self._share(lead, limit)
        else:
            m = self.cache.match(req.cache_key, req.prompt, limit) if limit > 0 else None
            m = self._live_match(slot, req, limit, m)
        if m is not None:
            run.blocks = self._take(m)
            run.n_computed = run.n_cached = m.n_tokens
        self._release_slot(slot)
        slot.run, slot.last_request = run, req
        self.preemption.seated(slot.id, run)
        run.timings.cache_n = run.n_cached
        run.t_prompt_start = time.perf_counter()
        return run

    def _live_match(self, slot: Slot, req: Request, limit: int, m: Match | None) -> Match | None:
        """Recurrent models: where ``req``'s prompt extends the first n tokens ``slot``
        retains from its last sequence under the same cache key, past what ``m`` (the cache's
        match, cut to a snapshot at a block boundary) reaches, and that sequence holds a state
        at n (its end, or a checkpoint where one of its prompts began: `StateStore.
        resume_point`), that state is handed over (`StateStore.adopt`) and the slot's blocks
        are the match: a chat's next turn computes its new message and the last answer token,
        an edited last message its new tokens, as llama-server's slot with its checkpoints.
        Else ``m``."""
        states, live = self.cache.states, slot.live
        if (
            states is None
            or live is None
            or live[1] is not slot.tokens
            or slot.cache_key != req.cache_key
        ):
            return m
        lo = m.n_tokens if m is not None else 0
        n = states.resume_point(slot.id, live[0], req.prompt, slot.tokens, lo, limit)
        if n < 0 or not states.adopt(slot.id, live[0], req.id, n):
            return m
        k, rem = divmod(n, self.bs)
        return Match(list(slot.blocks[:k]), slot.blocks[k] if rem else None, rem, n)

    def _take(self, m: Match) -> list[int]:
        """References on a match's blocks (its partial block copied into a new one), all or
        nothing: on an error every reference taken here is given back."""
        held: list[int] = []
        try:
            for b in m.blocks:
                self.cache.acquire(b)
                held.append(b)
            if m.partial_block is not None:
                self.cache.acquire(m.partial_block)  # keep it alive across the copy
                held.append(m.partial_block)
                dst = self.cache.allocate()
                self.copies.append((m.partial_block, dst, m.partial_len))
                held.pop()  # the copy job now holds the source (`release_copy_sources`)
                held.append(dst)
        except BaseException:
            self.cache.release(held)
            raise
        return held

    def take_copies(self) -> list[tuple[int, int, int]]:
        """Copy-on-write jobs for the runner; their source blocks are released after."""
        jobs, self.copies = self.copies, []
        return jobs

    def release_copy_sources(self, jobs: list[tuple[int, int, int]]) -> None:
        self.cache.release([src for src, _, _ in jobs])

    def _release_slot(self, slot: Slot) -> None:
        blocks, slot.blocks, slot.tokens = slot.blocks, [], []
        self.cache.release(blocks)

    def finish(self, run: Run) -> None:
        """Index the sequence's KV under its cache key; its slot retains the blocks."""
        self.preemption.catchup.pop(run.req.id, None)
        self._retire(run)

    def _retire(self, run: Run) -> None:
        slot = self.slots[run.slot]
        # generated tokens' KV is shared too: decode computes exactly what a prefill of the
        # same tokens does (row-independent kernels), so a later request may reuse it
        n = run.n_computed
        self.cache.insert(run.req.cache_key, run.tokens[:n], run.blocks)
        keep = (n + self.bs - 1) // self.bs
        extra = run.blocks[keep:]
        slot.run, slot.cache_key = None, run.req.cache_key
        slot.tokens, slot.blocks = run.tokens[:n], run.blocks[:keep]
        slot.live = (run.req.id, slot.tokens)
        slot.last_used = time.perf_counter()
        self.cache.release(extra)  # then the cache budget holds again

    def schedule(self) -> list[tuple[Run, BatchItem]]:
        """Decode tokens of running sequences, then recomputations of resumed ones and prefill
        chunks, within the budget (`step_plan.compose`). A run whose item cannot be prepared
        (no block left for it) goes to `broken`, alone."""
        return compose(self)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
