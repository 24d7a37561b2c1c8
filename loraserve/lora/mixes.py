"""A request's adapter mix: `Mix` (scales and their prefix-cache key), and `MixResolver`,
the part of `AdapterRegistry` that turns a request's `lora` list, its `model` name and the
global map into a `Mix` (ids or names, aLoRA position spans, content-keyed cache keys)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loraserve.cache.prefix_cache import CacheKey, Spans
from loraserve.lora.adapter import Adapter
from loraserve.lora.alora import PositionMixes, position_mixes
from loraserve.lora.catalogue import Catalogue


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


def scale_of(adapter_id: int | str, s: float) -> float:
    """``s`` as a float; ValueError naming the adapter when it is not finite."""
    s = float(s)
    if not math.isfinite(s):
        raise ValueError(f"LoRA adapter {adapter_id}: scale must be finite, got {s}")
    return s


class UnknownModelName(ValueError):
    """A request's `model` names no loaded adapter (raised only when asked to be strict),
    a `lora` entry names no adapter, or a catalogued adapter's file is gone."""


class MixResolver:
    """Request mixes over the registry's adapters (mixed into `AdapterRegistry`; engine
    thread only, as the registry)."""

    catalogue: Catalogue
    _global: dict[int, float]

    def get(self, adapter_id: int) -> Adapter:  # pragma: no cover - the registry's
        raise NotImplementedError

    def lookup(self, name: str) -> Adapter | None:  # pragma: no cover - the registry's
        raise NotImplementedError

    def list(self) -> list[Adapter]:  # pragma: no cover - the registry's
        raise NotImplementedError

    def resolve(self, request_lora: Sequence[tuple[int | str, float]] | None) -> dict[int, float]:
        """A request's effective mix (id -> non-zero scale).

        Its own list when present and non-empty (unlisted ids -> 0; duplicate ids: the last
        one wins; unknown id: ValueError), else a snapshot of the global map. An entry may
        name its adapter instead of its id (`lookup`; `UnknownModelName` if none has it).
        """
        if request_lora:
            mix: dict[int, float] = {}
            for ref, s in request_lora:
                i = self._id_of(ref)
                mix[i] = scale_of(i, s)
        else:
            mix = self._global
        return {i: s for i, s in mix.items() if s != 0.0}

    def _id_of(self, ref: int | str) -> int:
        if isinstance(ref, str):
            a = self.lookup(ref)
            if a is None:
                raise UnknownModelName(f"lora: no adapter named {ref!r}{self._offered()}")
            return a.id
        return self.get(ref).id

    def _offered(self) -> str:
        return " (none under --lora-dir either)" if self.catalogue else ""

    def mix(
        self,
        request_lora: Sequence[tuple[int | str, float]] | None,
        adapter_name: str | None = None,
        strict: bool = False,
    ) -> Mix:
        """A request's effective `Mix`: `scales_of` its request and their `cache_key`."""
        return self.make_mix(*self.scales_of(request_lora, adapter_name, strict))

    def make_mix(self, scales: dict[int, float], name: str | None) -> Mix:
        """The `Mix` of resolved ``scales`` (their adapters' current content identities)."""
        return Mix(scales, self.cache_key(scales), name) if scales or name else BASE

    def scales_of(
        self,
        request_lora: Sequence[tuple[int | str, float]] | None,
        adapter_name: str | None = None,
        strict: bool = False,
    ) -> tuple[dict[int, float], str | None]:
        """A request's effective scales, `resolve` of its own list (plus the adapter that
        ``adapter_name`` names, case ignored, at scale 1, unless listed; the catalogue's
        adapters included), and that adapter's name. ValueError naming an unknown id or a
        non-finite scale; with ``strict``, `UnknownModelName` for a name that no adapter
        has."""
        named = self.lookup(adapter_name) if adapter_name is not None else None
        if adapter_name is not None and named is None and strict:
            loaded = ", ".join(repr(a.name) for a in self.list()) or "none"
            raise UnknownModelName(
                f"model: {adapter_name!r} is neither the model nor a loaded adapter "
                f"(adapters: {loaded})"
            )
        if named is not None and all(self._id_of(i) != named.id for i, _ in request_lora or ()):
            request_lora = [*(request_lora or ()), (named.id, 1.0)]
        scales = self.resolve(request_lora)
        return scales, named.name if named is not None else None

    def request_key(
        self, scales: Mapping[int, float], prompt: Sequence[int]
    ) -> tuple[CacheKey | Spans, PositionMixes] | None:
        """A prompt's cache key per position span and the scales from each span on, when
        ``scales`` hold aLoRA adapters (`lora.alora`); None when they hold none."""
        inv = {i: self.get(i).alora for i in scales if self.get(i).alora}
        return position_mixes(scales, inv, prompt, self.cache_key) if inv else None

    def cache_key(self, mix: Mapping[int, float]) -> CacheKey:
        """Canonical prefix-cache key of a mix: sorted (content id, scale), zeros dropped.

        Adapters with equal content add up (their deltas are linear in the scale), so
        ids loaded from one file share KV, and +s/-s of the same content is the base ().
        """
        total: dict[str, float] = {}
        for i, s in mix.items():
            if s != 0.0:
                a = self.get(i)
                cid = a.content_id or f"on disk:{a.path}"  # never read yet (routing only)
                total[cid] = total.get(cid, 0.0) + float(s)
        return tuple(sorted((c, s) for c, s in total.items() if s != 0.0))
