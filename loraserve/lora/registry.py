"""The registered adapters, the global scale map, and a request's `Mix` with its cache key.

An adapter is registered by a load (`load`) or on first use of a name the catalogue
offers (`lookup`, on disk until the engine reads it: `read` off the engine thread, then
`install`); `evict` sends a resident adapter back to disk (`lora.tiers`), keeping its id,
name, global scale and content identity. Every method but `read` is meant for the engine
thread only (the thread that runs the model): loads, unloads and global-scale changes are
posted to it like requests, so a request's snapshot of the global map is taken in the
order the server received them. Nothing here locks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from torch import nn

from loraserve.lora.adapter import Adapter, AdapterError, load_adapter
from loraserve.lora.alora import invocation_tokens
from loraserve.lora.catalogue import Catalogue
from loraserve.lora.content_ids import ContentIds
from loraserve.lora.delta import LoraBatch, Span
from loraserve.lora.mixes import BASE, Mix, MixResolver, UnknownModelName, scale_of
from loraserve.lora.tiers import TierLimits, TierStats, resident_bytes
from loraserve.model.attn.mla import LatentAttention
from loraserve.model.ffn.moe import MoE
from loraserve.model.loader import LoadedModel
from loraserve.model.projection import Projection

__all__ = ["BASE", "AdapterRegistry", "Mix", "UnknownModelName", "base_shapes"]


def base_shapes(decoder: nn.Module) -> dict[str, tuple[int, ...]]:
    """Adaptable base tensors of a decoder: projections (out, in), stacked experts (E, out, in)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for m in decoder.modules():
        if isinstance(m, Projection):  # a fused projection adapts as its parts
            for name, lo, hi in m.spans:
                shapes[name] = (hi - lo, m.in_features)
        elif isinstance(m, MoE):
            for stem, w in (("gate", m.gate), ("up", m.up), ("down", m.down)):
                if w:  # ungated experts have no gate stack
                    shapes[f"{m.prefix}ffn_{stem}_exps.weight"] = (len(w), *w[0].shape)
            if m.fused:  # the file's fused gate|up stack (gate rows first)
                n, d = m.gate[0].shape
                shapes[f"{m.prefix}ffn_gate_up_exps.weight"] = (len(m.gate), 2 * n, d)
        elif isinstance(m, LatentAttention):  # per-head attn_k_b / attn_v_b (H, out, in)
            shapes.update(m.head_shapes())
    return shapes


class AdapterRegistry(MixResolver):
    """Adapters by id (load order; ids are never reused) and the global id -> scale map.

    Names are unique without regard to case: a name given at load that is taken is refused,
    a name taken from the file that is taken gets a suffix (``-2``, ``-3``...)."""

    def __init__(
        self,
        model: LoadedModel,
        catalogue: Catalogue | None = None,
        limits: TierLimits | None = None,
    ) -> None:
        self.model = model
        self.shapes = base_shapes(model.decoder)
        self.catalogue = catalogue or Catalogue()
        self.limits = limits or TierLimits()
        self.stats = TierStats()
        self.content_ids = ContentIds()  # files read before: a re-read skips the hash
        self._adapters: dict[int, Adapter] = {}
        self._global: dict[int, float] = {}
        self._next_id = 0
        self._clock = 0
        self._residency = 0  # bumped whenever an adapter's weights come or go
        self._resident_keys: tuple[int, frozenset[tuple[int, str]]] = (-1, frozenset())

    def load(
        self, path: str | Path, scale: float = 1.0, name: str | None = None, pinned: bool = False
    ) -> Adapter:
        """Load and register an adapter with global ``scale``; raises `AdapterError` (or a
        ValueError for a ``name`` already taken) and leaves the registry unchanged if the
        file does not fit the model."""
        scale_of(self._next_id, scale)
        self._check_free(name)
        t0 = time.perf_counter()
        loaded = self.read_path(path)
        return self.add_loaded(loaded, scale, name, pinned, time.perf_counter() - t0)

    def read_path(self, path: str | Path) -> Adapter:
        """Read an adapter file or PEFT folder (any thread; `AdapterError` if it does not
        fit the model)."""
        adapter = load_adapter(path, self.model.config, self.shapes, self.content_ids)
        try:
            adapter.alora = invocation_tokens(adapter.metadata)
        except ValueError as e:
            raise AdapterError(f"{path}: {e}") from None
        return adapter

    def add_loaded(
        self,
        adapter: Adapter,
        scale: float = 1.0,
        name: str | None = None,
        pinned: bool = False,
        seconds: float = 0.0,
    ) -> Adapter:
        """Register what `read_path` returned, resident, at global ``scale``."""
        scale = scale_of(self._next_id, scale)
        self._check_free(name)
        adapter.name = name if name is not None else self._free_name(adapter.name)
        adapter.pinned = pinned
        self._add(adapter, scale)
        self.stats.loads += 1
        self.stats.load_seconds += seconds
        self._share_weights(adapter)
        return adapter

    def replace(self, adapter_id: int, loaded: Adapter, seconds: float, pinned: bool) -> None:
        """An adapter takes another file's weights in place (vLLM's ``load_inplace``):
        same id, name and scale; its content identity, so its cache key, is the new one."""
        a = self.get(adapter_id)
        a.path = loaded.path
        a.pinned = a.pinned or pinned
        self.install(adapter_id, loaded, seconds)

    def register(
        self, path: str | Path, name: str, scale: float = 0.0, pinned: bool = False
    ) -> Adapter:
        """Register an adapter on disk under ``name`` (read on its first use); ValueError
        for a name already taken."""
        scale = scale_of(self._next_id, scale)
        self._check_free(name)
        adapter = Adapter(name, Path(path), "", {}, pinned=pinned)
        self._add(adapter, scale)
        return adapter

    def _check_free(self, name: str | None) -> None:
        taken = self.find(name) if name is not None else None
        if taken is not None:
            raise ValueError(
                f"name: an adapter named {taken.name!r} is already loaded (id {taken.id})"
            )

    def _add(self, adapter: Adapter, scale: float) -> None:
        self._residency += 1
        adapter.id = self._next_id
        adapter.last_used = self._clock
        self._next_id += 1
        self._adapters[adapter.id] = adapter
        self._global[adapter.id] = scale

    def lookup(self, name: str) -> Adapter | None:
        """The adapter named ``name`` (case ignored): a registered one, else the catalogue's
        entry, registered now on disk at global scale 0; None if neither has it."""
        found = self.find(name)
        if found is None:
            entry = self.catalogue.lookup(name)
            if entry is not None:
                found = self.register(entry.path, entry.name)
        return found

    def read(self, adapter_id: int) -> Adapter:
        """Read a registered adapter's file into a new, unregistered `Adapter`: any thread
        (it touches no registry state but the path). `AdapterError` if it does not fit the
        model, `UnknownModelName` if the file is gone."""
        path = self.get(adapter_id).path
        if not path.exists():
            raise UnknownModelName(f"adapter {self.get(adapter_id).name!r}: {path} is gone")
        return self.read_path(path)

    def install(self, adapter_id: int, loaded: Adapter, seconds: float = 0.0) -> Adapter:
        """Make a registered adapter resident with what `read` returned (its content
        identity is the file's now: a changed file gets a new one, so a new cache key)."""
        a = self.get(adapter_id)
        self._residency += 1
        a.weights, a.content_id, a.metadata = loaded.weights, loaded.content_id, loaded.metadata
        a.alora = loaded.alora
        self.stats.loads += 1
        self.stats.load_seconds += seconds
        self._share_weights(a)
        return a

    def _share_weights(self, a: Adapter) -> None:
        twin = next(
            (
                b
                for b in self._adapters.values()
                if b is not a and b.weights and b.content_id == a.content_id
            ),
            None,
        )
        if twin is not None:  # one copy of equal weights
            a.weights = twin.weights
            self.stats.shared_loads += 1

    def evict(self, adapter_id: int) -> None:
        """Send a resident adapter back to disk (the engine checks it is idle)."""
        self.get(adapter_id).weights = {}
        self._residency += 1
        self.stats.evictions += 1

    def missing(self, scales: Mapping[int, float]) -> list[int]:
        """The adapters of a mix that are not resident."""
        return [i for i in scales if not self.get(i).weights]

    def touch(self, ids: Iterable[int]) -> None:
        """Mark adapters as used now (least recently used ones are evicted first)."""
        self._clock += 1
        for i in ids:
            if i in self._adapters:
                self._adapters[i].last_used = self._clock

    @property
    def resident(self) -> list[Adapter]:
        """The adapters whose weights are in memory, in id order."""
        return [a for a in self.list() if a.weights]

    def resident_keys(self) -> frozenset[tuple[int, str]]:
        """(id, content identity) of every resident adapter, recomputed only after a
        load, eviction or unload (a step asks for it: never O(registered) per step)."""
        if self._resident_keys[0] != self._residency:
            keys = frozenset((a.id, a.content_id) for a in self._adapters.values() if a.weights)
            self._resident_keys = (self._residency, keys)
        return self._resident_keys[1]

    @property
    def resident_bytes(self) -> int:
        """Bytes of resident adapter weights (shared weights counted once)."""
        return sum(resident_bytes(self.resident))

    def unload(self, adapter_id: int) -> None:
        """Forget an adapter. The engine must not unload one that a running request uses."""
        self.get(adapter_id)
        self._residency += 1
        del self._adapters[adapter_id], self._global[adapter_id]

    def get(self, adapter_id: int) -> Adapter:
        """The adapter with this id; ValueError naming it if there is none."""
        try:
            return self._adapters[adapter_id]
        except (KeyError, TypeError):
            raise ValueError(f"no LoRA adapter with id {adapter_id!r}") from None

    def find(self, name: str) -> Adapter | None:
        """The loaded adapter with this name, case ignored (None if there is none)."""
        key = name.casefold()
        return next((a for a in self._adapters.values() if a.name.casefold() == key), None)

    def _free_name(self, name: str) -> str:
        out, k = name, 1
        while self.find(out) is not None:
            k += 1
            out = f"{name}-{k}"
        return out

    def list(self) -> list[Adapter]:
        """Loaded adapters in id order."""
        return [self._adapters[i] for i in sorted(self._adapters)]

    @property
    def global_scales(self) -> dict[int, float]:
        """A copy of the global map, every loaded id included (0 for off)."""
        return dict(self._global)

    def set_global(self, items: Iterable[tuple[int | str, float]]) -> None:
        """Replace the global map: listed adapters (by id, or by name: a catalogue entry is
        registered on disk, read on its first use) get their scale, unlisted ones 0.

        Validates everything first (unknown id or name, non-finite scale: ValueError naming
        it), so a bad list changes nothing. Duplicate ids: the last one wins.
        """
        items = list(items)
        for ref, s in items:
            if isinstance(ref, str):
                if self.find(ref) is None and self.catalogue.lookup(ref) is None:
                    raise UnknownModelName(f"lora: no adapter named {ref!r}{self._offered()}")
            else:
                self.get(ref)
            scale_of(ref, s)
        new = dict.fromkeys(self._adapters, 0.0)
        for ref, s in items:
            i = self._id_of(ref)
            new[i] = scale_of(i, s)
        self._global = new

    def uses_content(self, content_id: str) -> bool:
        """Whether a loaded adapter has this content identity."""
        return any(a.content_id == content_id for a in self._adapters.values())

    def build_delta(self, spans: list[Span]) -> LoraBatch | None:
        """The runner's ``lora_builder``: one step's `LoraBatch` (None without spans)."""
        return LoraBatch(spans, self._adapters, self.resident_keys()) if spans else None
