"""A slot file's cache key as JSON and back (`slot_io` writes it in the file's metadata)."""

from __future__ import annotations

from loraserve.cache.prefix_cache import CacheKey, Spans, spans


def _plain(key: object) -> CacheKey:
    return tuple((str(c), float(s)) for c, s in key)  # type: ignore[attr-defined]


def encode_key(key: CacheKey | Spans) -> object:
    """A cache key as JSON: [[content id, scale], ...], or {"spans": [[first position,
    key], ...]} for a key per position span (aLoRA)."""
    if isinstance(key, Spans):
        return {"spans": [[start, [[c, s] for c, s in k]] for start, k in key.parts]}
    return [[c, s] for c, s in key]


def decode_key(obj: object) -> CacheKey | Spans:
    """`encode_key`'s inverse."""
    if isinstance(obj, dict):
        return spans([(int(start), _plain(k)) for start, k in obj["spans"]])
    return _plain(obj)
