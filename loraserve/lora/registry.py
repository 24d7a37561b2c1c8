"""The loaded adapters, the global scale map, and a request's `Mix` with its cache key.

Every method is meant for the engine thread only (the thread that runs the model): loads,
unloads and global-scale changes are posted to it like requests, so a request's snapshot
of the global map is taken in the order the server received them. Nothing here locks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from loraserve.cache.prefix_cache import CacheKey
from loraserve.lora.adapter import Adapter, load_adapter
from loraserve.lora.delta import LoraBatch, Span
from loraserve.model.loader import LoadedModel
from loraserve.model.moe import MoE
from loraserve.model.projection import Projection


def base_shapes(decoder: nn.Module) -> dict[str, tuple[int, ...]]:
    """Adaptable base tensors of a decoder: projections (out, in), stacked experts (E, out, in)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for m in decoder.modules():
        if isinstance(m, Projection):  # a fused projection adapts as its parts
            for name, lo, hi in m.spans:
                shapes[name] = (hi - lo, m.in_features)
        elif isinstance(m, MoE):
            for stem, w in (("gate", m.gate), ("up", m.up), ("down", m.down)):
                shapes[f"{m.prefix}ffn_{stem}_exps.weight"] = (len(w), *w[0].shape)
    return shapes


@dataclass(frozen=True)
class Mix:
    """A request's effective adapter mix, fixed at receipt: ``scales`` (adapter id ->
    non-zero scale) and ``cache_key``, their canonical prefix-cache key; ``named`` is the
    name of the adapter the request's `model` named (None if it named none).

    Made by `AdapterRegistry.mix` only, so the key always matches the scales.
    """

    scales: Mapping[int, float] = field(default_factory=dict)
    cache_key: CacheKey = ()
    named: str | None = field(default=None, compare=False)


BASE = Mix()  # the base model: no adapter


def _scale(adapter_id: int, s: float) -> float:
    s = float(s)
    if not math.isfinite(s):
        raise ValueError(f"LoRA adapter {adapter_id}: scale must be finite, got {s}")
    return s


class UnknownModelName(ValueError):
    """A request's `model` names no loaded adapter (raised only when asked to be strict)."""


class AdapterRegistry:
    """Adapters by id (load order; ids are never reused) and the global id -> scale map.

    Names are unique without regard to case: a name given at load that is taken is refused,
    a name taken from the file that is taken gets a suffix (``-2``, ``-3``...)."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.shapes = base_shapes(model.decoder)
        self._adapters: dict[int, Adapter] = {}
        self._global: dict[int, float] = {}
        self._next_id = 0

    def load(self, path: str | Path, scale: float = 1.0, name: str | None = None) -> Adapter:
        """Load and register an adapter with global ``scale``; raises `AdapterError` (or a
        ValueError for a ``name`` already taken) and leaves the registry unchanged if the
        file does not fit the model."""
        scale = _scale(self._next_id, scale)
        taken = self.find(name) if name is not None else None
        if taken is not None:
            raise ValueError(
                f"name: an adapter named {taken.name!r} is already loaded (id {taken.id})"
            )
        adapter = load_adapter(path, self.model.config, self.shapes)
        adapter.id = self._next_id
        adapter.name = name if name is not None else self._free_name(adapter.name)
        self._next_id += 1
        self._adapters[adapter.id] = adapter
        self._global[adapter.id] = scale
        return adapter

    def unload(self, adapter_id: int) -> None:
        """Forget an adapter. The engine must not unload one that a running request uses."""
        self.get(adapter_id)
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

    def set_global(self, items: Iterable[tuple[int, float]]) -> None:
        """Replace the global map: listed ids get their scale, unlisted ones 0.

        Validates everything first (unknown id or non-finite scale: ValueError naming it),
        so a bad list changes nothing. Duplicate ids: the last one wins.
        """
        new = dict.fromkeys(self._adapters, 0.0)
        for i, s in items:
            self.get(i)
            new[i] = _scale(i, s)
        self._global = new

    def resolve(self, request_lora: Sequence[tuple[int, float]] | None) -> dict[int, float]:
        """A request's effective mix (id -> non-zero scale).

        Its own list when present and non-empty (unlisted ids -> 0; duplicate ids: the last
        one wins; unknown id: ValueError), else a snapshot of the global map.
        """
        if request_lora:
            mix: dict[int, float] = {}
            for i, s in request_lora:
                self.get(i)
                mix[i] = _scale(i, s)
        else:
            mix = self._global
        return {i: s for i, s in mix.items() if s != 0.0}

    def mix(
        self,
        request_lora: Sequence[tuple[int, float]] | None,
        adapter_name: str | None = None,
        strict: bool = False,
    ) -> Mix:
        """A request's effective `Mix`: `resolve` of its own list (plus the adapter that
        ``adapter_name`` names, case ignored, at scale 1, unless listed) and the mix's
        `cache_key`. ValueError naming an unknown id or a non-finite scale; with ``strict``,
        `UnknownModelName` for a name that no adapter has."""
        named = self.find(adapter_name) if adapter_name is not None else None
        if adapter_name is not None and named is None and strict:
            loaded = ", ".join(repr(a.name) for a in self.list()) or "none"
            raise UnknownModelName(
                f"model: {adapter_name!r} is neither the model nor a loaded adapter "
                f"(adapters: {loaded})"
            )
        if named is not None and all(i != named.id for i, _ in request_lora or ()):
            request_lora = [*(request_lora or ()), (named.id, 1.0)]
        scales = self.resolve(request_lora)
        name = named.name if named is not None else None
        return Mix(scales, self.cache_key(scales), name) if scales or name else BASE

    def uses_content(self, content_id: str) -> bool:
        """Whether a loaded adapter has this content identity."""
        return any(a.content_id == content_id for a in self._adapters.values())

    def cache_key(self, mix: Mapping[int, float]) -> CacheKey:
        """Canonical prefix-cache key of a mix: sorted (content id, scale), zeros dropped.

        Adapters with equal content add up (their deltas are linear in the scale), so
        ids loaded from one file share KV, and +s/-s of the same content is the base ().
        """
        total: dict[str, float] = {}
        for i, s in mix.items():
            if s != 0.0:
                cid = self.get(i).content_id
                total[cid] = total.get(cid, 0.0) + float(s)
        return tuple(sorted((c, s) for c, s in total.items() if s != 0.0))

    def build_delta(self, spans: list[Span]) -> LoraBatch | None:
        """The runner's ``lora_builder``: one step's `LoraBatch` (None without spans)."""
        return LoraBatch(spans, self._adapters) if spans else None
