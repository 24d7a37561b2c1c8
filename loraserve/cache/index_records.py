"""The prefix index's records (a lookup's `Match`, an indexed block's `_Node`, the
`CacheStats` counters) and the check of its invariants (`check_index`, what
`PrefixCache.check` asserts in tests), beside `prefix_cache.PrefixCache` that uses them."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loraserve.cache.keys import BlockKey, _head

if TYPE_CHECKING:
    from loraserve.cache.prefix_cache import PrefixCache

Parent = int | str  # block id, or ROOT


@dataclass
class Match:
    """Result of a lookup: full blocks to share, then an optional partial block to copy."""

    blocks: list[int] = field(default_factory=list)
    partial_block: int | None = None
    partial_len: int = 0
    n_tokens: int = 0


@dataclass
class _Node:
    parent: Parent
    bkey: BlockKey
    tokens: tuple[int, ...]
    children: int = 0
    last_used: int = 0

    @property
    def slot(self) -> tuple[Parent, Hashable]:
        """Where it is listed: its parent and the key at its first position."""
        return (self.parent, self.bkey[0][1])


@dataclass
class CacheStats:
    hits: int = 0  # lookups that reused at least one token
    misses: int = 0
    hit_tokens: int = 0
    evictions: int = 0  # blocks evicted


def check_index(cache: PrefixCache) -> None:
    """Assert the invariants of ``cache``'s index (the module docstring of `prefix_cache`)."""
    cache.pool.check()
    n_kids: dict[int, int] = {}
    for b, node in cache._nodes.items():
        assert b in cache.pool._used, f"indexed block {b} is free"
        assert cache._children[node.slot][(node.bkey, node.tokens)] == b
        assert node.bkey and node.bkey[0][0] == 0 and _head(node.bkey, len(node.tokens))
        if isinstance(node.parent, int):
            assert node.parent in cache._nodes and len(cache._nodes[node.parent].tokens) == cache.bs
            n_kids[node.parent] = n_kids.get(node.parent, 0) + 1
    assert sum(len(k) for k in cache._children.values()) == len(cache._nodes)
    for b, node in cache._nodes.items():
        n = n_kids.get(b, 0)
        assert n == node.children, f"block {b} child count {node.children} != {n}"
    cached = {b for b in cache._nodes if cache.pool.refcount[b] == 0}
    assert cache._n_cached == len(cached), "cached count out of step"
    assert cache._evictable == {b for b in cached if cache._nodes[b].children == 0}
    if cache.budget is not None:
        # over the budget only while no cached block can go: a cached block whose child
        # is held (a twin's chain extended by another sequence) waits for that child
        fits = cache.cached_cost() <= cache.budget + 1e-9
        assert fits or not cache._evictable, "budget exceeded"
    assert cache._snap_cached == {b for b in cached if cache.states and cache.states.has(b)}


def _common_prefix(toks: tuple[int, ...], tokens: Sequence[int], start: int, limit: int) -> int:
    n = 0
    for t in toks:
        if start + n >= limit or tokens[start + n] != t:
            break
        n += 1
    return n
