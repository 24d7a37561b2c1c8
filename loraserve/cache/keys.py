"""Adapter cache keys of a sequence's positions, as the prefix index namespaces its blocks.

A sequence's key is one `CacheKey` for all its positions, or `Spans` when it changes along the
sequence (an aLoRA adapter acts only from its invocation on); a block's *block key* is the key
of its own positions as (offset in the block, key) segments (`block_key`). `salted` puts a key
in a tenant's namespace. Used by `prefix_cache.PrefixCache` (which re-exports these names).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Hashable
from dataclasses import dataclass

CacheKey = tuple[tuple[str, float], ...]  # sorted (adapter content id, scale), scale != 0
BlockKey = tuple[tuple[int, Hashable], ...]  # (offset in the block, key) segments


@dataclass(frozen=True)
class Spans:
    """A key that changes along a sequence: ``parts`` are (first position, key), the first
    at position 0, positions ascending, neighbours' keys different (made by `spans`)."""

    parts: tuple[tuple[int, CacheKey], ...]

    def block_key(self, lo: int, hi: int) -> BlockKey:
        """The segments of positions lo..hi-1, offsets relative to ``lo``."""
        out = []
        for j, (start, key) in enumerate(self.parts):
            end = self.parts[j + 1][0] if j + 1 < len(self.parts) else hi
            if start < hi and end > lo:
                out.append((max(start - lo, 0), key))
        return tuple(out)


def spans(parts: list[tuple[int, CacheKey]]) -> CacheKey | Spans:
    """The key of a sequence whose key is ``parts[i][1]`` from position ``parts[i][0]`` on
    (sorted, the first at 0): a plain `CacheKey` when it is one key throughout."""
    out: list[tuple[int, CacheKey]] = []
    for start, key in sorted(parts):
        if out and out[-1][0] == start:
            out[-1] = (start, key)
        elif not out or out[-1][1] != key:
            out.append((start, key))
    return out[0][1] if len(out) == 1 else Spans(tuple(out))


SALT_TAG = "salt:"  # the first element of a salted key: ("salt:<sha256 of the salt>", 0.0)


@functools.lru_cache(maxsize=1024)
def _salt_entry(salt: str) -> tuple[str, float]:
    return (SALT_TAG + hashlib.sha256(salt.encode()).hexdigest(), 0.0)


def salted(key: CacheKey | Spans, salt: str) -> CacheKey | Spans:
    """``key`` in the namespace of tenant ``salt`` ('' is the shared namespace: ``key``
    itself). The salt's digest leads the key of every position, so two tenants never share
    a block, whatever their prompts and adapters (vLLM's `cache_salt`)."""
    if not salt:
        return key
    tag = _salt_entry(salt)
    if isinstance(key, Spans):
        return Spans(tuple((start, (tag, *k)) for start, k in key.parts))
    return (tag, *key)


def block_key(key: Hashable, lo: int, hi: int) -> BlockKey:
    """The block key of positions lo..hi-1 of a sequence whose key is ``key``."""
    return key.block_key(lo, hi) if isinstance(key, Spans) else ((0, key),)


def _head(bkey: BlockKey, n: int) -> BlockKey:
    """A block key restricted to its first ``n`` positions."""
    return tuple(seg for seg in bkey if seg[0] < n)
