"""Adapters on demand: a request whose mix holds adapters on disk waits, outside the
scheduler, while their files are read off the engine thread; other requests keep decoding.

`receive` resolves a submission's scales at receipt (the engine thread, in arrival order:
names the catalogue offers are registered there); when every adapter of the mix is
resident the requests enter the scheduler at once, else they are *parked* and each missing
adapter is read once (`AdapterRegistry.read` on a small thread pool: concurrent requests for
one adapter wait for the same read). The read's result comes back through the engine's
inbox: the adapter is installed, the mix's cache key computed from the content just read,
and the parked requests enter the scheduler in their arrival order, or fail with the
read's error (a gone file: `UnknownModelName`, a bad one: `AdapterError`).

`want` starts those reads earlier, at submit time on the caller's thread (`lora.prefetch`):
the engine's read claims the prefetched one of the same, unchanged file.

After every install, and whenever a previous pass could not get under the limits, idle
adapters are evicted to the tiers' limits (`lora.tiers.victims`): an adapter that a queued,
running or parked request uses, or a pinned one, never.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from loraserve.engine.inbox import Inbox
from loraserve.engine.request import Request
from loraserve.engine.scheduler import Scheduler
from loraserve.lora.adapter import Adapter
from loraserve.lora.prefetch import Prefetch, ReadResult, disk_path, will_need
from loraserve.lora.registry import AdapterRegistry, Mix
from loraserve.lora.tiers import victims

MAX_READS = 2  # adapter files read at once
# a reader's nice over the engine thread's (`LORASERVE_READER_NICE`; 0: the engine's own).
# Measured at 2000 adapters from disk (62a3cb3): +14 starved reads (52-119 ms against 12-23)
# and lowered the ratio (0.81x vs 0.88x), -5 did not raise it (0.885x)
READER_NICE = int(os.environ.get("LORASERVE_READER_NICE", "0"))


@dataclass
class _Parked:
    reqs: list[Request]
    scales: dict[int, float]
    named: str | None
    received: Future[Mix]


class AdapterLoads:
    """The parked submissions and the adapter reads in flight of one engine."""

    def __init__(self, registry: AdapterRegistry, scheduler: Scheduler, inbox: Inbox) -> None:
        self.reg, self.sched, self.inbox = registry, scheduler, inbox
        self._parked: list[_Parked] = []
        self._reading: set[int] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.engine_tid: int | None = None  # the engine thread's OS id: readers take its nice
        self.overflow = False  # the last eviction pass left the limits exceeded
        self.prefetch = Prefetch(registry.read_path, self.off_thread)
        self._wanted: Counter[int | str] = Counter()  # submitted, not yet received
        self._wanted_lock = threading.Lock()

    def want(
        self, lora: Sequence[tuple[int | str, float]] | None, adapter_name: str | None
    ) -> None:
        """Caller's thread, at submit: start reading the adapters the submission names that
        are on disk (best effort; the receipt decides, and names any error)."""
        if not self.inbox.threaded:
            return  # without an engine thread the receipt follows at once
        with self._wanted_lock:  # kept from eviction until received (`in_use`)
            self._wanted.update(_refs(lora, adapter_name))
        for ref in [*(ref for ref, _ in lora or ()), *([adapter_name] if adapter_name else [])]:
            path = disk_path(self.reg, ref)
            if path is not None:
                try:
                    self.prefetch.start(path)
                except Exception:  # a hint only: the receipt reads it, or names the error
                    continue

    @property
    def busy(self) -> bool:
        """Whether requests wait for an adapter read."""
        return bool(self._parked)

    def receive(
        self,
        reqs: list[Request],
        lora: Sequence[tuple[int | str, float]] | None,
        adapter_name: str | None,
        strict: bool,
        received: Future[Mix],
    ) -> None:
        """Engine thread: fix the submission's scales now and queue its requests once their
        adapters are resident (``received`` gets the `Mix`, or the error that refused it)."""
        with self._wanted_lock:
            self._wanted.subtract(_refs(lora, adapter_name))
            self._wanted = +self._wanted  # counts at 0 (or below, if never wanted) go
        scales, named = self.reg.scales_of(lora, adapter_name, strict)
        self.reg.touch(scales)
        parked = _Parked(reqs, scales, named, received)
        missing = self.reg.missing(scales)
        if not missing:
            self._admit(parked)
            return
        self._parked.append(parked)
        self._read(missing)

    def in_use(self) -> set[int]:
        """Adapters that a queued, running or parked request uses, and the resident ones a
        submission not yet received names (it would read them again at once)."""
        users = [*self.sched.waiting, *(r.req for r in self.sched.running)]
        ids = {i for r in users for i in r.mix.scales}
        with self._wanted_lock:
            wanted = set(self._wanted)
        if wanted:
            ids.update(a.id for a in self.reg.resident if {a.id, a.name.casefold()} & wanted)
        return ids.union(*(p.scales for p in self._parked))

    def enforce(self) -> list[Adapter]:
        """Evict idle adapters, least recently used first, to the tiers' limits."""
        gone = victims(self.reg.list(), self.in_use(), self.reg.limits)
        for a in gone:
            self.reg.evict(a.id)
        resident = self.reg.resident
        self.overflow = self.reg.limits.over(len(resident), self.reg.resident_bytes)
        return gone

    def close(self) -> None:
        """Stop the read pool (reads in flight finish; their results are dropped)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
        self.prefetch.clear()  # reads cancelled with the pool never finish

    def off_thread(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the read pool (at once here without an engine thread)."""
        if not self.inbox.threaded:
            fn()
            return
        with self._pool_lock:  # submit time posts reads too: any thread
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    MAX_READS, thread_name_prefix="loraserve-lora", initializer=self._like_engine
                )
            self._pool.submit(fn)

    def _like_engine(self) -> None:
        """A reader thread runs at the engine thread's scheduling priority (`server/offload.
        lower_priority` lowers the engine's; a reader spawned by a submitting thread would
        otherwise keep that thread's, above the engine's and the event loop's share), plus
        `READER_NICE`: above 0 a read yields the cores to decoding, below 0 it takes them
        first (a shorter wait for its requests, the same CPU taken from the engine)."""
        if self.engine_tid is None or not hasattr(os, "setpriority"):
            return
        try:
            nice = os.getpriority(os.PRIO_PROCESS, self.engine_tid) + READER_NICE
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, max(-20, nice)))
        except OSError:  # gone, or not allowed (a sandbox): the reader keeps its own
            pass

    def _admit(self, p: _Parked) -> None:
        mix = self.reg.make_mix(p.scales, p.named)
        for r in p.reqs:
            r.mix = mix
            keyed = self.reg.request_key(mix.scales, r.prompt)  # aLoRA: per position span
            if keyed is not None:
                r.spans_key, r.mixes = keyed
            self.sched.add(r)
        p.received.set_result(mix)

    def _read(self, ids: list[int]) -> None:
        """Start reading the adapters ``ids`` that are not being read already (all are
        marked first: without an engine thread each read finishes inside this call)."""
        new = [i for i in ids if i not in self._reading]  # one read for all who wait
        self._reading.update(new)
        for adapter_id in new:
            if not self.inbox.threaded:  # no engine thread (tests, the CLI): read here
                self._done(adapter_id, *_timed(self.reg.read, adapter_id))
                continue

            path = self.reg.get(adapter_id).path
            held = self.prefetch.claim(path)
            if held is not None:  # read since its submission: installed once it is done

                def ready(f: Future[ReadResult], adapter_id: int = adapter_id) -> None:
                    self.inbox.call(lambda: self._done(adapter_id, *f.result()))

                held.add_done_callback(ready)
                continue

            def job(adapter_id: int = adapter_id) -> None:
                result = _timed(self.reg.read, adapter_id)
                self.inbox.call(lambda: self._done(adapter_id, *result))

            will_need(path)  # the disk starts while the job waits for a reader
            self.off_thread(job)

    def _done(
        self, adapter_id: int, loaded: Adapter | None, error: BaseException | None, dt: float
    ) -> None:
        """Engine thread: install a read adapter (or record its failure) and move on the
        parked submissions that waited for it."""
        self._reading.discard(adapter_id)
        if loaded is not None:
            self.reg.install(adapter_id, loaded, dt)
        else:
            self.reg.stats.load_failures += 1
        self.prefetch.finish(self.reg.get(adapter_id).path)  # resident: none starts now
        still: list[_Parked] = []
        ready: list[_Parked] = []
        again: list[int] = []
        for p in self._parked:
            if adapter_id in p.scales and error is not None:
                p.received.set_exception(error)
            elif any(i in self._reading for i in p.scales):
                still.append(p)
            elif missing := self.reg.missing(p.scales):  # evicted while it waited: again
                still.append(p)
                again += missing
            else:
                ready.append(p)
        self._parked = still
        for p in ready:  # in arrival order; one that cannot enter fails alone
            try:
                self._admit(p)
            except Exception as e:  # handed to its caller, the others still enter
                if not p.received.done():
                    p.received.set_exception(e)
        a = self.reg.get(adapter_id)
        if error is not None and not a.content_id and adapter_id not in self.in_use():
            self.reg.unload(adapter_id)  # never read: the catalogue entry stays as it was
        self.enforce()
        if again:
            self._read(again)


def _refs(
    lora: Sequence[tuple[int | str, float]] | None, adapter_name: str | None
) -> list[int | str]:
    """The adapters a submission names: ids, and names case folded."""
    refs = [*(ref for ref, _ in lora or ()), *([adapter_name] if adapter_name else [])]
    return [r.casefold() if isinstance(r, str) else r for r in refs]


def _timed(
    fn: Callable[[int], Adapter], adapter_id: int
) -> tuple[Adapter | None, BaseException | None, float]:
    t0 = time.perf_counter()
    try:
        return fn(adapter_id), None, time.perf_counter() - t0
    except Exception as e:  # handed to the requests that wait
        return None, e, time.perf_counter() - t0
