"""The engine: one thread that owns the model, the KV pool and every sequence.

Loop: run the inbox (submissions, admin calls) → admit → schedule → one forward over the
whole batch → sample → post-process and send events. The public methods are the only
door: other threads `submit` requests and read each request's event queue, and every
other action (adapters, global scales, slots, views) is a method whose result comes back
on a `Future`, computed on the engine thread between steps.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from concurrent.futures import Future
from typing import TypeVar

from loraserve.engine.adapter_loads import AdapterLoads
from loraserve.engine.admission import QueueBudget, current_client, current_tenant
from loraserve.engine.budget import BudgetSpec
from loraserve.engine.constraint import GrammarSpec
from loraserve.engine.core import EngineConfig, EngineCore, slot_context
from loraserve.engine.embedding import Pooling
from loraserve.engine.engine_calls import EngineCalls
from loraserve.engine.inbox import Inbox
from loraserve.engine.request import Request, Submission
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecRequest
from loraserve.engine.spec.draft_model import DraftModel, check_vocab
from loraserve.heap import HeapTrim
from loraserve.lora.registry import Mix
from loraserve.model.loader import LoadedModel

log = logging.getLogger("loraserve.engine")
T = TypeVar("T")


class Engine(EngineCalls):
    """Continuous-batching engine over one model: the thread-safe door to `EngineCore`
    (requests here; adapters, slots and snapshots in `EngineCalls`)."""

    def __init__(
        self,
        model: LoadedModel,
        config: EngineConfig | None = None,
        draft: LoadedModel | None = None,
    ) -> None:
        """``draft``: a draft model for `draft-simple` speculation (`VocabMismatch` if its
        vocabulary is not the model's)."""
        config = config or EngineConfig()
        self.model, self.config = model, config
        drafter = None
        if draft is not None:
            check_vocab(model, draft)
            n_ctx_slot = slot_context(config)
            drafter = DraftModel(draft, config.n_slots, n_ctx_slot, config.spec.draft_p_min)
        self.core = EngineCore(model, config, drafter)
        self.n_ctx_slot = self.core.n_ctx_slot
        self.tokenizer = model.tokenizer
        self.eog_ids = frozenset(model.tokenizer.eog_ids)  # tokens that end generation
        self.listeners = self.core.listeners  # called on the engine thread with each event
        self._inbox = Inbox()
        self.loads = AdapterLoads(self.core.adapters, self.core.scheduler, self._inbox)
        self._thread: threading.Thread | None = None
        self._stop = False

    # -- public, thread-safe ------------------------------------------------------------
    def submit(
        self,
        prompts: Seq[list[int]],
        sampling: SamplingParams,
        *,
        max_tokens: int = -1,
        stop: Iterable[str] = (),
        lora: Seq[tuple[int | str, float]] | None = None,
        adapter_name: str | None = None,
        cache_prompt: bool = True,
        id_slot: int = -1,
        pooling: Pooling | None = None,
        grammar: str | None = None,
        reasoning_budget: BudgetSpec | None = None,
        spec: SpecRequest | None = None,
        n: int = 1,
        strict_name: bool = False,
        progress: bool = False,
        client: str | None = None,
        cache_salt: str = "",
    ) -> Submission:
        """Queue ``n`` requests per prompt (prompt-major), all under one effective adapter mix.

        The ``n`` requests of a prompt share its KV: the first computes the prompt, the
        others wait for that and start from its KV (one prefill); with a seed, request ``j``
        samples with seed + ``j``, as llama-server's `n_cmpl` children. With
        ``strict_name``, an ``adapter_name`` that names no adapter refuses the submission
        (`UnknownModelName`).

        The mix is ``lora`` (adapter id or name, scale) when present and non-empty, plus
        the adapter ``adapter_name`` names at scale 1 unless listed; else a snapshot of the
        global scales. It is resolved on the engine thread at receipt, in arrival order
        with every other call, and the requests enter the scheduler in that same call, so
        no global change or unload slips in between; unless an adapter of the mix is on
        disk (a catalogue name's first use, or evicted): then they enter once it is read,
        off the engine thread, with the cache key of the content read (`AdapterLoads`).

        With ``pooling`` each request is an embedding: its prompt runs under the mix and
        is never sampled; the final event carries the pooled hidden states
        (`Event.embedding`). Poolings that read every row never reuse cached KV.
        With ``grammar`` (llguidance's text, from `compile_grammar`) every token sampled
        is one the grammar allows, and the request stops once the grammar is complete.
        With ``reasoning_budget`` the end of reasoning is forced once its tokens are spent.
        ``spec`` holds the request's `speculative.*` fields (the server's with None).
        With ``progress``, a generation request also gets prompt-progress events
        (`Event.progress`, no token) at admission and after each prefill chunk.

        Admission (`admission`): ``client`` (default: the caller's `current_client`) is who
        asked, for the fair sharing of slots; ``cache_salt`` and the caller's
        `current_tenant` (`--cache-isolation key`) put the requests' KV in their tenant's
        namespace of the prefix cache. `QueueFull` if the queue cannot take them all.
        """
        if pooling is not None and not pooling.reuses_cache:
            cache_prompt = False
        if client is None:
            client = current_client.get()
        salt = "\x00".join(s for s in (current_tenant.get(), cache_salt) if s)
        reqs: list[Request] = []
        for p in prompts:
            first: Request | None = None
            for j in range(n):
                seed = sampling.seed if sampling.seed < 0 else (sampling.seed + j) % 2**32
                req = Request(
                    prompt=list(p),
                    sampling=dataclasses.replace(sampling, seed=seed) if j else sampling,
                    max_tokens=max_tokens,
                    stop=tuple(stop),
                    cache_prompt=cache_prompt,
                    id_slot=id_slot if first is None else -1,
                    eog_ids=self.eog_ids,
                    pooling=pooling,
                    grammar=grammar,
                    reasoning_budget=reasoning_budget,
                    spec=spec,
                    leader=first,
                    progress=progress,
                    client=client,
                    cache_salt=salt,
                )
                first = first or req
                reqs.append(req)

        queue = self.core.scheduler.queue
        queue.reserve(reqs)  # QueueFull: nothing was queued
        received: Future[Mix] = Future()
        received.add_done_callback(lambda f: _unqueue(f, reqs, queue))

        def receive() -> None:
            try:
                self.loads.receive(reqs, lora, adapter_name, strict_name, received)
            except BaseException as e:  # handed to the caller
                received.set_exception(e)

        self.loads.want(lora, adapter_name)  # adapters on disk: their reads start now
        self._inbox.call(receive)
        return Submission(reqs, received)

    def cancel(self, req: Request) -> None:
        """Stop a request; its slot is freed at the next step (no final event)."""
        req.cancelled = True
        self._inbox.wake.set()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the engine thread between steps (or now if no thread runs)."""
        return self._inbox.call(fn)

    def compile_grammar(self, spec: GrammarSpec) -> str:
        """llguidance's grammar text for a request's GBNF or JSON schema, for `submit`;
        ValueError says why it is invalid. Thread-safe (the vocabulary's llguidance form is
        immutable once built; the first call builds it, ~1 s on 262,144 tokens)."""
        return self.core.grammars.compile(spec)

    @property
    def n_slots(self) -> int:
        return self.config.n_slots

    def start(self) -> None:
        """Run the engine loop on its own thread."""
        self._inbox.threaded = True
        self._thread = threading.Thread(target=self._loop, name="loraserve-engine", daemon=True)
        self._thread.start()
        self.loads.engine_tid = self._thread.native_id  # adapter readers take its priority

    @property
    def thread_native_id(self) -> int | None:
        """The engine thread's OS thread id (None before `start`), for its scheduling
        priority (`server/offload.lower_priority`)."""
        return None if self._thread is None else self._thread.native_id

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (what it was running gets no final event)."""
        self._stop = True
        self._inbox.wake.set()
        self.loads.close()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._inbox.threaded = False

    @property
    def busy(self) -> bool:
        """Whether anything is running, waiting or posted."""
        return self.core.busy or self.loads.busy or not self._inbox.empty

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        """Step until nothing is left (used without a thread, e.g. tests and the CLI)."""
        for _ in range(max_steps):
            if not self.step() and not self.busy:
                return

    def step(self) -> bool:
        """Run the inbox, then one engine step; returns whether a forward pass ran."""
        self._inbox.run()
        if self.loads.overflow:
            self.loads.enforce()
        return self.core.step()

    def _loop(self) -> None:
        heap = HeapTrim()  # the C heaps' free pages back: on falling idle, every few s
        while not self._stop:
            try:
                ran = self.step()
            except Exception as e:  # last resort: the running requests fail, the thread lives
                log.exception("engine step failed")
                for seq in self.core.scheduler.running:
                    self.core.fail(seq, f"internal error in the engine: {e}")
                ran = True
            if ran:
                heap.worked()
            else:
                heap.idle()
                self._inbox.wake.wait(0.05)
                self._inbox.wake.clear()


def _unqueue(received: Future[Mix], reqs: list[Request], queue: QueueBudget) -> None:
    """A refused submission's requests never queue: their places are given back."""
    if received.exception() is not None:
        for r in reqs:
            queue.release(r)
