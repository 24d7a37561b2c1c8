"""The engine's core: the state the engine thread owns, and one step over it.

A step: free cancelled slots → admit waiting requests → schedule decode rows and prefill
chunks within the token budget → one forward over the whole batch (failure isolated per
sequence) → sample → detokenize, check stops and send each request its events.

One owner per state: the scheduler owns the waiting queue and the slots, the pool the
block reference counts, the prefix cache its index, the runner the KV tensors, the
registry the adapters and the global scales; all of them only ever run on this thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from loraserve.engine.constraint import Constraint, Grammars
from loraserve.engine.embedding import Pooler
from loraserve.engine.engine_config import EngineConfig, slot_context
from loraserve.engine.isolation import (
    forward_isolated,
    guarded,
    sample_isolated,
    scrub_kv,
    send_failures,
)
from loraserve.engine.memory import build_cache
from loraserve.engine.output import TextOutput
from loraserve.engine.request import Event, Progress, Run, StopType
from loraserve.engine.request_log import request_line
from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.engine.sampling.state import SamplerState
from loraserve.engine.scheduler import Scheduler
from loraserve.engine.spec.drafter import DraftFn, Speculator
from loraserve.engine.spec.verify import verify
from loraserve.lora.catalogue import Catalogue
from loraserve.lora.registry import AdapterRegistry
from loraserve.lora.tiers import TierLimits
from loraserve.model.loader import LoadedModel

log = logging.getLogger("loraserve.engine")
__all__ = ["EngineConfig", "EngineCore", "request_line", "slot_context"]  # re-exported too


class EngineCore:
    """The model, KV pool, prefix cache, scheduler, runner and adapters of one engine."""

    def __init__(
        self, model: LoadedModel, config: EngineConfig, draft_model: DraftFn | None = None
    ) -> None:
        self.config = config
        cfg = model.config
        bs = config.block_size
        kv_dtype = config.kv_dtype
        self.n_ctx_slot = slot_context(config)
        # phi3: long rope factors past the trained context, chosen for this engine alone
        for_context = getattr(model.decoder, "for_context", None)
        decoder = model.decoder if for_context is None else for_context(self.n_ctx_slot)
        self.pool, self.cache, states = build_cache(cfg, config, self.n_ctx_slot)
        self.scheduler = Scheduler(
            config.n_slots,
            self.n_ctx_slot,
            config.ubatch,
            self.cache,
            config.max_queue,
            config.preempt_after_s,
        )
        mib = config.lora_max_mib
        self.adapters = AdapterRegistry(
            model,
            Catalogue(config.lora_dirs, config.lora_modules),
            TierLimits(config.lora_max_loaded, None if mib is None else int(mib * 2**20)),
        )
        self.runner = ModelRunner(
            decoder, bs, kv_dtype, lora=self.adapters.build_delta, states=states
        )
        self.runner.ensure_capacity(self.pool.capacity)
        self.tokenizer = model.tokenizer
        self._outputs: dict[int, TextOutput] = {}
        self.listeners: list[Callable[[Run, Event], None]] = []  # metrics hooks
        self.n_forward = 0  # forward passes run (`/metrics` n_decode_total)
        self.n_busy_rows = 0  # sum over forward passes of the sequences they ran
        self.grammars = Grammars(model.tokenizer)  # constrained generation
        self.spec = Speculator(config.spec, self.n_ctx_slot, draft_model)

    @property
    def busy(self) -> bool:
        """Whether a request is running or waiting."""
        return bool(self.scheduler.running or self.scheduler.waiting)

    def step(self) -> bool:
        """One scheduling round; returns whether a forward pass ran. An exception in one
        request's admission, scheduling, post-processing or events fails that request alone
        (`isolation.guarded`); the others go on as if it had never been there."""
        sched = self.scheduler
        for slot in sched.slots:
            if slot.run is not None and slot.run.req.cancelled:
                guarded(self, slot.run, "cancelling", self._finish, slot.run, StopType.NONE, False)
        for run in sched.admit():
            guarded(self, run, "admission", self._setup, run)
        for run in sched.dropped:  # cancelled while preempted: nothing more to send
            self._outputs.pop(run.req.id, None)
        sched.dropped.clear()
        send_failures(self)
        if self.config.spec.enabled:
            self.spec.propose(sched.running, sched.token_budget)
        work = sched.schedule()
        send_failures(self)
        if not work:
            return False
        for run, item in work:  # whose recurrent state each item continues
            item.slot, item.seq = run.slot, run.req.id
        copies = sched.take_copies()
        self.runner.ensure_capacity(self.pool.capacity)
        for src, dst, n in copies:
            self.runner.copy_block(src, dst, n)
        sched.release_copy_sources(copies)
        step = forward_isolated(self.runner, work)  # a failing sequence fails alone
        self.n_forward += 1
        self.n_busy_rows += len(work)
        for run, message in step.failed:
            guarded(self, run, "failing", self.fail, run, message)
        sampling: list[tuple[Run, int]] = []  # (run, its first logits row)
        row = 0
        for i, (run, item) in enumerate(step.done):
            hidden = step.hidden[i] if i < len(step.hidden) else None
            if guarded(self, run, "post-processing", self._advance, run, item, hidden):
                if run.pooler is None and run.n_computed >= run.n_prompt and item.want_logits:
                    sampling.append((run, row))
            row += item.n_logits if item.want_logits else 0
        if sampling:
            verify(self, sampling, step.logits, step.top)
        return True

    def _setup(self, run: Run) -> None:
        """A request just admitted: its pooler, or its sampler, text output and grammar (a
        preempted run resuming keeps its own)."""
        if run.sampler is not None:
            return
        if run.req.pooling is not None:
            run.pooler = Pooler(run.req.pooling)
            return
        run.sampler = SamplerState(run.req.sampling, run.req.prompt, set(run.req.eog_ids))
        self._outputs[run.req.id] = TextOutput(self.tokenizer, run.req.stop)
        if run.req.grammar is not None or run.req.reasoning_budget is not None:
            run.constraint = Constraint(self.grammars, run.req.grammar, run.req.reasoning_budget)
        if run.req.progress:
            self._progress(run)

    def _advance(self, run: Run, item: BatchItem, hidden: torch.Tensor | None) -> None:
        """A run's item of the step ran: count its computed tokens, feed its pooler or report
        its prompt's progress."""
        was_prefilling = run.prefilling
        run.n_computed += item.n - (item.n_logits - 1)  # a draft's rows: once verified
        if run.pooler is not None:
            self._pool(run, hidden)
        elif was_prefilling and run.req.progress and not run.generated:
            self._progress(run)

    def _progress(self, run: Run) -> None:
        """Tell a generation request how far its prompt is (before its first token)."""
        ms = (time.perf_counter() - run.t_prompt_start) * 1000
        p = Progress(run.n_prompt, run.n_cached, min(run.n_computed, run.n_prompt), ms)
        self._emit(run, Event(progress=p))

    def _pool(self, run: Run, rows: torch.Tensor | None) -> None:
        """Feed an embedding request's rows; at the end of its prompt, finish it with the
        pooled result (timings as a prompt with no generated token)."""
        assert run.pooler is not None
        if rows is not None:
            run.pooler.add(rows)
        if run.n_computed < run.n_prompt:
            return
        run.timings.prompt_n = run.n_prompt - run.n_cached
        run.timings.prompt_ms = (time.perf_counter() - run.t_prompt_start) * 1000
        self._finish(run, StopType.NONE, embedding=run.pooler.result())

    def _sample(
        self, runs: list[Run], logits: torch.Tensor, top: torch.Tensor | None = None
    ) -> None:
        """Sample each run's token from its row of ``logits`` [R, V]; ``top`` [R]: the rows'
        argmax as the step found it (unused where a grammar masks a row first)."""
        masked = [True] * len(runs)
        for i, run in enumerate(runs):
            if run.constraint is not None:  # the grammar's mask first, as llama.cpp
                masked[i] = guarded(self, run, "the grammar", run.constraint.mask, logits[i])
                top = None
        results = sample_isolated(logits, [s.sampler for s in runs], top)  # type: ignore[misc]
        now = time.perf_counter()
        for run, res, ok in zip(runs, results, masked, strict=True):
            if not ok:
                continue
            if isinstance(res, str):
                guarded(self, run, "failing", self.fail, run, res)
                continue
            if not run.generated:
                run.t_first = now
                run.timings.prompt_n = run.n_prompt - run.n_cached
                run.timings.prompt_ms = (now - run.t_prompt_start) * 1000
            self._accept(run, res.token, res.probs, res.prob)

    def _accept(
        self,
        run: Run,
        tok: int,
        probs: list[tuple[int, float]] | None,
        prob: float | None = None,
    ) -> None:
        """Take a sampled token (detokenize it, check the stops, send it); an error in that
        fails this run alone."""
        guarded(self, run, "post-processing", self._take, run, tok, probs, prob)

    def _take(
        self, run: Run, tok: int, probs: list[tuple[int, float]] | None, prob: float | None
    ) -> None:
        req = run.req
        run.generated.append(tok)
        run.tokens.append(tok)
        assert run.sampler is not None
        run.sampler.accept(tok)
        if tok in req.eog_ids and not req.sampling.ignore_eos:
            self._finish(run, StopType.EOS)
            return
        if run.constraint is not None and not run.constraint.accept(tok):
            self.fail(run, f"the grammar refused token {tok}: {run.constraint.error}")
            return
        out = self._outputs[req.id]
        text = out.push(tok)
        self._emit(run, Event(token=tok, text=text, probs=probs, prob=prob))
        if run.constraint is not None and run.constraint.finished:
            self._finish(run, StopType.EOS)  # the grammar allows nothing more
        elif out.stopping_word:
            self._finish(run, StopType.WORD)
        elif req.max_tokens >= 0 and len(run.generated) >= req.max_tokens:
            self._finish(run, StopType.LIMIT)
        elif len(run.tokens) >= self.n_ctx_slot:  # the slot's context is full
            self._finish(run, StopType.LIMIT, truncated=True)

    def _emit(self, run: Run, ev: Event) -> None:
        """Send ``ev`` to the request's reader (nothing after its final event); a listener
        that raises is logged, never fails the step."""
        req = run.req
        if req.ended:
            return
        req.ended = ev.done
        req.events.put(ev)
        for fn in self.listeners:
            try:
                fn(run, ev)
            except Exception:
                log.exception("event listener failed for request %d", req.id)

    def _finish(
        self,
        run: Run,
        stop: StopType,
        send: bool = True,
        embedding: torch.Tensor | None = None,
        truncated: bool = False,
    ) -> None:
        out = self._outputs.pop(run.req.id, None)
        tail = out.flush() if out is not None else ""
        run.timings.predicted_n = len(run.generated)
        if run.t_first:
            run.timings.predicted_ms = (time.perf_counter() - run.t_first) * 1000
        if out is not None and out.stopping_word:
            stop = StopType.WORD
        self.scheduler.finish(run)
        if send:
            ev = Event(
                text=tail,
                done=True,
                stop_type=stop,
                stopping_word=out.stopping_word if out else "",
                timings=run.timings,
                id_slot=run.slot,
                n_prompt=run.n_prompt,
                n_cached=run.n_cached,
                n_generated=len(run.generated),
                embedding=embedding,
                truncated=truncated,
            )
            self._emit(run, ev)
            log.info("%s", request_line(run, stop, self.adapters))

    def fail(self, run: Run, message: str) -> None:
        """End a sequence with an error event; its suspect KV is never reused. A run no
        longer in its slot (it finished, or failed already) only gets the event."""
        self._outputs.pop(run.req.id, None)
        if run.slot >= 0 and self.scheduler.slots[run.slot].run is run:
            run.n_computed = min(run.n_computed, run.n_cached)  # never index suspect KV
            scrub_kv(self.runner, run.blocks, run.n_cached)  # nor keep non-finite values
            self.scheduler.finish(run)
        self._emit(run, Event(done=True, error=message, id_slot=run.slot))
