"""The engine's calls besides requests: adapters (list, global scales, load, unload), slots
(views, save, restore, erase) and snapshots (`/metrics`), each computed on the engine thread
between steps, its result on a `Future`. A base of `Engine`, which holds the state these
use (``core``, ``model``, ``loads``, ``_inbox``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from loraserve.cache.prefix_cache import Spans
from loraserve.engine import slot_io
from loraserve.engine.views import EngineStats, SlotView, engine_stats, slot_views
from loraserve.lora.adapter import Adapter
from loraserve.lora.catalogue import Entry

if TYPE_CHECKING:
    from loraserve.engine.adapter_loads import AdapterLoads
    from loraserve.engine.core import EngineCore
    from loraserve.engine.inbox import Inbox
    from loraserve.model.loader import LoadedModel

T = TypeVar("T")
BUSY_WAIT_S = 30.0  # how long an admin call waits for a slot or an adapter to be free


class EngineCalls:
    """Adapters, slots and snapshots of an `Engine` (see the module docstring)."""

    core: EngineCore
    model: LoadedModel
    loads: AdapterLoads
    _inbox: Inbox

    def list_adapters(self) -> Future[list[tuple[Adapter, float]]]:
        """Every loaded adapter in id order, with its global scale."""

        def snapshot() -> list[tuple[Adapter, float]]:
            scales = self.core.adapters.global_scales
            return [(a, scales.get(a.id, 0.0)) for a in self.core.adapters.list()]

        return self._inbox.call(snapshot)

    def catalogue_entries(self) -> list[Entry]:
        """What `--lora-dir` and `--lora-modules` offer, by name (thread-safe: reads the
        directories, touches no engine state)."""
        return self.core.adapters.catalogue.list()

    def set_global_scales(self, items: Iterable[tuple[int, float]]) -> Future[None]:
        """Replace the global scales (unlisted adapters 0); ValueError changes nothing."""
        items = list(items)
        return self._inbox.call(lambda: self.core.adapters.set_global(items))

    def load_adapter(
        self,
        path: str | Path,
        scale: float = 1.0,
        name: str | None = None,
        pinned: bool = False,
        replace: bool = False,
    ) -> Future[Adapter]:
        """Load an adapter file or PEFT folder at global ``scale`` (ValueError if it does
        not fit the model, or ``name`` is taken). ``pinned``: never evicted. With
        ``replace``, an adapter already named ``name`` takes the file's weights in place
        (vLLM's ``load_inplace``; once no request uses it) and keeps its id and scale."""
        reg = self.core.adapters
        out: Future[Adapter] = Future()

        def register(loaded: Adapter, dt: float) -> Adapter | None:
            taken = reg.find(name) if name is not None else None
            if taken is not None and replace:
                if taken.id in self.loads.in_use():
                    return None
                reg.replace(taken.id, loaded, dt, pinned)
                a = taken
            else:
                a = reg.add_loaded(loaded, scale, name, pinned, dt)
            self.loads.enforce()
            return a

        def read() -> None:
            t0 = time.perf_counter()
            try:
                loaded = reg.read_path(path)
            except BaseException as e:  # handed to the caller
                out.set_exception(e)
                return
            dt = time.perf_counter() - t0
            busy = f"adapter {name!r} is in use by queued or running requests"
            done = self._inbox.call_when(lambda: register(loaded, dt), BUSY_WAIT_S, busy)
            done.add_done_callback(lambda f: _chain(f, out))

        self.loads.off_thread(read)
        return out

    def unload_adapter(self, adapter_id: int, wait_s: float = BUSY_WAIT_S) -> Future[Adapter]:
        """Unload an adapter once no queued or running request uses it (`EngineBusy` after
        ``wait_s``; ValueError for an unknown id). KV computed with it leaves the prefix
        cache unless another loaded adapter has the same content."""

        def unload() -> Adapter | None:
            adapter = self.core.adapters.get(adapter_id)
            if adapter_id in self.loads.in_use():
                return None
            self.core.adapters.unload(adapter_id)
            cid = adapter.content_id
            if not self.core.adapters.uses_content(cid):
                self.core.cache.drop_key(lambda key: any(c == cid for c, _ in key))
                self.core.spec.drop(lambda key: _mentions(key, cid))
            return adapter

        busy = f"adapter {adapter_id} is in use by queued or running requests"
        return self._inbox.call_when(unload, wait_s, busy)

    def slots(self) -> Future[list[SlotView]]:
        """A snapshot of every slot (`/slots`)."""
        return self._inbox.call(lambda: slot_views(self.core.scheduler))

    def stats(self) -> Future[EngineStats]:
        """A snapshot of the engine's gauges and prefix-cache counters (`/metrics`)."""
        return self._inbox.call(lambda: engine_stats(self.core))

    def slot_fingerprint(self) -> dict[str, object]:
        """What a slot file must match to be restored here (`slot_io.read`)."""
        return slot_io.fingerprint(self.model)

    def save_slot(self, slot_id: int, wait_s: float = BUSY_WAIT_S) -> Future[slot_io.SlotImage]:
        """A copy of what the slot retains, once it is idle (`EngineBusy` after ``wait_s``)."""
        busy = f"slot {slot_id} is processing a request"
        return self._inbox.call_when(
            lambda: slot_io.capture(self.core.scheduler, self.core.runner, slot_id), wait_s, busy
        )

    def restore_slot(
        self, slot_id: int, image: slot_io.SlotImage, wait_s: float = BUSY_WAIT_S
    ) -> Future[int]:
        """Make the idle slot retain ``image``, indexed under its saved cache key; the
        token count (`OutOfBlocks` if the pool cannot hold it)."""
        busy = f"slot {slot_id} is processing a request"
        core = self.core
        return self._inbox.call_when(
            lambda: slot_io.install(core.scheduler, core.runner, slot_id, image), wait_s, busy
        )

    def erase_slot(self, slot_id: int, wait_s: float = BUSY_WAIT_S) -> Future[int]:
        """The idle slot forgets its sequence; the tokens erased."""
        busy = f"slot {slot_id} is processing a request"
        sched = self.core.scheduler
        return self._inbox.call_when(lambda: slot_io.erase(sched, slot_id), wait_s, busy)


def _chain(src: Future[T], dst: Future[T]) -> None:
    e = src.exception()
    if e is not None:
        dst.set_exception(e)
    else:
        dst.set_result(src.result())


def _mentions(key: object, content_id: object) -> bool:
    """Whether a sequence's cache key (plain, or an aLoRA `Spans` of keys along its
    positions) uses the adapter content ``content_id`` anywhere."""
    parts = key.parts if isinstance(key, Spans) else ((0, key),)
    return any(c == content_id for _, k in parts for c, _ in k)  # type: ignore[union-attr]
