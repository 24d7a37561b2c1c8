"""The engine: one thread that owns the model, the KV pool and every sequence.

Loop: drain the inbox (requests, cancellations, calls) → admit → schedule → one
forward over the whole batch → sample → post-process and send events. HTTP handlers
never touch tensors; they `submit` requests and read each request's event queue, and
run anything else that touches engine state through `call`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from loraserve.cache.block_pool import BlockPool
from loraserve.cache.prefix_cache import PrefixCache
from loraserve.engine.isolation import forward_isolated, sample_isolated, scrub_kv
from loraserve.engine.output import TextOutput
from loraserve.engine.request import Event, Request, Sequence, StopType
from loraserve.engine.runner import ModelRunner
from loraserve.engine.sampling import SamplerState
from loraserve.engine.scheduler import Scheduler
from loraserve.model.loader import LoadedModel

log = logging.getLogger("loraserve.engine")
T = TypeVar("T")


@dataclass(frozen=True)
class EngineConfig:
    """Engine sizing, mirroring llama-server's flags."""

    n_slots: int = 1  # -np
    n_ctx: int = 4096  # -c: KV tokens shared by the slots
    ubatch: int = 512  # tokens per forward step (prefill chunking)
    block_size: int = 16
    cache_ram_mib: float = 8192  # budget for cached blocks no slot holds; -1 = unlimited
    kv_dtype: torch.dtype = torch.float32


class Engine:
    """Continuous-batching engine over one model."""

    def __init__(self, model: LoadedModel, config: EngineConfig = EngineConfig()) -> None:
        self.model, self.config = model, config
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
        self.runner = ModelRunner(model.decoder, bs, kv_dtype)
        from loraserve.lora.registry import AdapterRegistry

        self.adapters = AdapterRegistry(model)  # engine-thread only, like the scheduler
        self.runner.lora_builder = self.adapters.build_delta
        self.runner.ensure_capacity(self.pool.capacity)
        self.tokenizer = model.tokenizer
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._outputs: dict[int, TextOutput] = {}
        self.listeners: list[Callable[[Sequence, Event], None]] = []  # metrics hooks

    # -- public, thread-safe ------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """Queue a request; its events arrive on ``req.events``."""
        self._inbox.put(("req", req))
        self._wake.set()

    def cancel(self, req: Request) -> None:
        req.cancelled = True
        self._wake.set()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the engine thread between steps (or now if no thread runs)."""
        fut: Future[T] = Future()
        if self._thread is None:
            _run_into(fn, fut)
        else:
            self._inbox.put(("call", (fn, fut)))
            self._wake.set()
        return fut

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="loraserve-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def busy(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting or not self._inbox.empty())

    # -- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop:
            try:
                ran = self.step()
            except Exception as e:  # last resort: the running requests fail, the thread lives
                log.exception("engine step failed")
                for seq in self.scheduler.running:
                    self._fail(seq, f"internal error in the engine: {e}")
                ran = True
            if not ran:
                self._wake.wait(0.05)
                self._wake.clear()

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        """Step until nothing is left (used without a thread, e.g. tests and the CLI)."""
        for _ in range(max_steps):
            if not self.step() and not self.busy:
                return

    def step(self) -> bool:
        """One scheduling round; returns whether a forward pass ran."""
        self._drain_inbox()
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
            self._fail(seq, message)
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
                self._fail(seq, res)
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

    def _fail(self, seq: Sequence, message: str) -> None:
        self._outputs.pop(seq.req.id, None)
        seq.n_computed = min(seq.n_computed, seq.n_cached)  # never index suspect KV
        scrub_kv(self.runner, seq.blocks, seq.n_cached)  # nor let padded reads see it
        self.scheduler.finish(seq)
        self._emit(seq, Event(done=True, error=message, id_slot=seq.slot))

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "req":
                self.scheduler.add(payload)
            else:
                fn, fut = payload
                _run_into(fn, fut)


def _run_into(fn: Callable[[], T], fut: Future[T]) -> None:
    try:
        fut.set_result(fn())
    except BaseException as e:  # handed to the caller
        fut.set_exception(e)
