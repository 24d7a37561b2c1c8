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
from dataclasses import dataclass

import torch

from loraserve.cache.block_pool import BlockPool
from loraserve.cache.prefix_cache import PrefixCache
from loraserve.engine.isolation import forward_isolated, sample_isolated, scrub_kv
from loraserve.engine.output import TextOutput
from loraserve.engine.request import Event, Sequence, StopType
from loraserve.engine.runner import ModelRunner
from loraserve.engine.sampling import SamplerState
from loraserve.engine.scheduler import Scheduler
from loraserve.lora.registry import AdapterRegistry
from loraserve.model.loader import LoadedModel

log = logging.getLogger("loraserve.engine")


@dataclass(frozen=True)
class EngineConfig:
    """Engine sizing, mirroring llama-server's flags."""

    n_slots: int = 1  # -np
    n_ctx: int = 4096  # -c: KV tokens shared by the slots
    ubatch: int = 512  # tokens per forward step (prefill chunking)
    block_size: int = 16
    cache_ram_mib: float = 8192  # budget for cached blocks no slot holds; -1 = unlimited
    kv_dtype: torch.dtype = torch.float32


class EngineCore:
    """The model, KV pool, prefix cache, scheduler, runner and adapters of one engine."""

    def __init__(self, model: LoadedModel, config: EngineConfig) -> None:
        self.config = config
        cfg = model.config
        bs = config.block_size
        kv_dtype = config.kv_dtype
        self.n_ctx_slot = max(config.n_ctx // config.n_slots, 1)
        per_slot = (self.n_ctx_slot + bs - 1) // bs + 1
        block_bytes = 2 * cfg.n_layers * bs * cfg.n_kv_heads * cfg.head_dim * kv_dtype.itemsize
        held = config.n_slots * (per_slot + 1)
        if config.cache_ram_mib < 0:
            budget = None
            max_blocks = held * 8
        else:
            budget = int(config.cache_ram_mib * 2**20 // block_bytes)
            max_blocks = held + budget
        self.pool = BlockPool(bs, max_blocks, initial_blocks=min(held, 256))
        self.cache = PrefixCache(self.pool, budget)
        self.scheduler = Scheduler(
            config.n_slots,
            self.n_ctx_slot,
            config.ubatch,
            self.cache,
        )
        self.adapters = AdapterRegistry(model)
        self.runner = ModelRunner(model.decoder, bs, kv_dtype, lora=self.adapters.build_delta)
        self.runner.ensure_capacity(self.pool.capacity)
        self.tokenizer = model.tokenizer
        self._outputs: dict[int, TextOutput] = {}
        self.listeners: list[Callable[[Sequence, Event], None]] = []  # metrics hooks

    @property
    def busy(self) -> bool:
        """Whether a request is running or waiting."""
        return bool(self.scheduler.running or self.scheduler.waiting)

    def step(self) -> bool:
        """One scheduling round; returns whether a forward pass ran."""
        sched = self.scheduler
        for slot in sched.slots:
            if slot.seq is not None and slot.seq.req.cancelled:
                self._finish(slot.seq, StopType.NONE, send=False)
        for seq in sched.admit():
            seq.sampler = SamplerState(seq.req.sampling, seq.req.prompt, set(seq.req.eog_ids))
            self._outputs[seq.req.id] = TextOutput(self.tokenizer, seq.req.stop)
        work = sched.schedule()
        if not work:
            return False
        copies = sched.take_copies()
        self.runner.ensure_capacity(self.pool.capacity)
        for src, dst, n in copies:
            self.runner.copy_block(src, dst, n)
        sched.release_copy_sources(copies)
        step = forward_isolated(self.runner, work)  # a failing sequence fails alone
        for seq, message in step.failed:
            self.fail(seq, message)
        sampling: list[Sequence] = []
        for seq, item in step.done:
            seq.n_computed += item.n
            if seq.n_computed >= seq.n_prompt and item.want_logits:
                sampling.append(seq)
        if sampling:
            self._sample(sampling, step.logits)
        return True

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        results = sample_isolated(logits, [s.sampler for s in seqs])  # type: ignore[misc]
        now = time.perf_counter()
        for seq, res in zip(seqs, results, strict=True):
            if isinstance(res, str):
                self.fail(seq, res)
                continue
            if not seq.generated:
                seq.t_first = now
                seq.timings.prompt_n = seq.n_prompt - seq.n_cached
                seq.timings.prompt_ms = (now - seq.t_prompt_start) * 1000
            self._accept(seq, res.token, res.probs, res.prob)

    def _accept(
        self,
        seq: Sequence,
        tok: int,
        probs: list[tuple[int, float]] | None,
        prob: float | None = None,
    ) -> None:
        req = seq.req
        seq.generated.append(tok)
        seq.tokens.append(tok)
        assert seq.sampler is not None
        seq.sampler.accept(tok)
        if tok in req.eog_ids and not req.sampling.ignore_eos:
            self._finish(seq, StopType.EOS)
            return
        out = self._outputs[req.id]
        text = out.push(tok)
        self._emit(seq, Event(token=tok, text=text, probs=probs, prob=prob))
        if out.stopping_word:
            self._finish(seq, StopType.WORD)
        elif req.max_tokens >= 0 and len(seq.generated) >= req.max_tokens:
            self._finish(seq, StopType.LIMIT)
        elif len(seq.tokens) >= self.n_ctx_slot:
            self._finish(seq, StopType.LIMIT)

    def _emit(self, seq: Sequence, ev: Event) -> None:
        seq.req.events.put(ev)
        for fn in self.listeners:
            fn(seq, ev)

    def _finish(self, seq: Sequence, stop: StopType, send: bool = True) -> None:
        out = self._outputs.pop(seq.req.id, None)
        tail = out.flush() if out is not None else ""
        seq.timings.predicted_n = len(seq.generated)
        if seq.t_first:
            seq.timings.predicted_ms = (time.perf_counter() - seq.t_first) * 1000
        if out is not None and out.stopping_word:
            stop = StopType.WORD
        seq.text = out.text if out is not None else ""
        self.scheduler.finish(seq)
        if send:
            ev = Event(
                text=tail,
                done=True,
                stop_type=stop,
                stopping_word=out.stopping_word if out else "",
                timings=seq.timings,
                id_slot=seq.slot,
                n_prompt=seq.n_prompt,
                n_cached=seq.n_cached,
                n_generated=len(seq.generated),
            )
            self._emit(seq, ev)

    def fail(self, seq: Sequence, message: str) -> None:
        """End a running sequence with an error event; its suspect KV is never reused."""
        self._outputs.pop(seq.req.id, None)
        seq.n_computed = min(seq.n_computed, seq.n_cached)  # never index suspect KV
        scrub_kv(self.runner, seq.blocks, seq.n_cached)  # nor let padded reads see it
        self.scheduler.finish(seq)
        self._emit(seq, Event(done=True, error=message, id_slot=seq.slot))
