"""Prefix index over KV blocks, namespaced by the adapter cache key of every position.

A sequence's key is one `CacheKey` for all its positions, or `Spans` when it changes
along the sequence (an aLoRA adapter acts only from its invocation on: the positions
before it are computed under the rest of the mix). A block's *block key* is the key of
its own positions, as (offset in the block, key) segments. A node is a block: its parent
(the previous full block of the same sequence, or the root), its block key and the
tokens it holds (``block_size`` of them, or fewer for a sequence's tail). Nodes are
identified exactly by (parent, block key, tokens), never by a hash, so KV is shared only
where every position up to it was computed under the same key over the same tokens, and
a lookup never returns KV computed under another adapter configuration — the invariant
loraserve exists for. A partial match into a block reuses only positions whose key there
is the requested one.

Invariants (checked by `check`):
- every indexed block is used in the pool; its parent is a root or an indexed full
  block; only full blocks have children;
- an indexed block with refcount 0 is "cached" and counts against the budget; the
  budget is enforced after every release; only childless cached blocks ("evictable")
  are evicted, least recently used first; both sets are kept incrementally at every
  reference, child and index change (so references go through `acquire`/`release`);
- indexed blocks are immutable: sequences write only into blocks they allocated and
  that are not indexed yet (a partial match is copied, copy-on-write);
- with recurrent layers (``states``, `cache.state`), a match ends only after a full block
  that has a state snapshot (the exact state there, under the same key), and a block's
  snapshot is dropped when the block is freed.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from loraserve.cache.block_pool import BlockPool, OutOfBlocks
from loraserve.cache.state import StateStore

CacheKey = tuple[tuple[str, float], ...]  # sorted (adapter content id, scale), scale != 0
Parent = int | str  # block id, or ROOT
BlockKey = tuple[tuple[int, Hashable], ...]  # (offset in the block, key) segments
ROOT = "root"


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


class PrefixCache:
    """Maps (cache key, token prefix) to KV blocks, with an LRU budget for unheld blocks."""

    def __init__(
        self, pool: BlockPool, budget_blocks: int | None, states: StateStore | None = None
    ) -> None:
        self.pool = pool
        self.states = states  # recurrent models: state snapshots that follow blocks
        self.bs = pool.block_size
        self.budget = budget_blocks  # None = unlimited (bounded by the pool)
        self._nodes: dict[int, _Node] = {}
        # (parent, key at the block's first position) -> (block key, tokens) -> block
        self._children: dict[tuple[Parent, Hashable], dict[tuple[BlockKey, tuple], int]] = {}
        self._clock = itertools.count(1)
        self._n_cached = 0  # indexed blocks with refcount 0
        self._evictable: set[int] = set()  # ...of them, those without children
        self.stats = CacheStats()

    # -- lookup -------------------------------------------------------------------
    def match(self, key: CacheKey | Spans, tokens: Sequence[int], limit: int) -> Match:
        """Longest cached prefix of ``tokens[:limit]`` computed under ``key``.

        Matched blocks are not referenced yet: the caller `acquire`s what it keeps.
        """
        m = Match()
        parent: Parent = ROOT
        now = next(self._clock)
        i = 0
        while i < limit:
            want = block_key(key, i, i + self.bs)
            kids = self._children.get((parent, want[0][1]))
            if not kids:
                break
            chunk = tuple(tokens[i : i + self.bs])
            full = kids.get((want, chunk)) if len(chunk) == self.bs else None
            if full is not None and i + self.bs <= limit:
                self._nodes[full].last_used = now
                m.blocks.append(full)
                parent = full
                i += self.bs
                continue
            best, best_len = None, 0  # longest common prefix with any child
            for (bkey, toks), b in kids.items():
                n = _common_prefix(toks, tokens, i, limit)
                while n and _head(bkey, n) != _head(want, n):
                    n -= 1  # only positions computed under the key wanted there
                if n > best_len:
                    best, best_len = b, n
            if best is not None:
                self._nodes[best].last_used = now
                m.partial_block, m.partial_len = best, best_len
                i += best_len
            break
        if self.states is not None:  # resume only where an exact state follows the prefix
            m.partial_block, m.partial_len = None, 0
            while m.blocks and not self.states.has(m.blocks[-1]):
                m.blocks.pop()
            i = len(m.blocks) * self.bs
        m.n_tokens = i
        if i:
            self.stats.hits += 1
            self.stats.hit_tokens += i
        else:
            self.stats.misses += 1
        return m

    # -- insertion ------------------------------------------------------------------
    def insert(self, key: CacheKey | Spans, tokens: Sequence[int], blocks: Sequence[int]) -> None:
        """Index a sequence's blocks holding KV for ``tokens`` (len <= len(blocks) * bs).

        A block whose (parent, block key, tokens) is already indexed is skipped (the indexed
        twin stays the chain's node); the sequence keeps its own references either way.
        """
        parent: Parent = ROOT
        now = next(self._clock)
        for j, b in enumerate(blocks):
            chunk = tuple(tokens[j * self.bs : (j + 1) * self.bs])
            if not chunk:
                break
            bkey = block_key(key, j * self.bs, j * self.bs + len(chunk))
            kids = self._children.setdefault((parent, bkey[0][1]), {})
            twin = kids.get((bkey, chunk))
            if twin is None and b not in self._nodes:
                kids[(bkey, chunk)] = b
                self._nodes[b] = _Node(parent, bkey, chunk, last_used=now)
                if self.pool.refcount[b] == 0:
                    self._n_cached += 1
                    self._evictable.add(b)
                if isinstance(parent, int):
                    self._nodes[parent].children += 1
                    self._evictable.discard(parent)
                twin = b
            elif twin is None:
                break  # b is indexed elsewhere (cannot happen for a well-formed sequence)
            if len(chunk) < self.bs:
                break
            self._nodes[twin].last_used = now
            parent = twin

    # -- references, release and eviction -------------------------------------------
    def acquire(self, b: int) -> None:
        """Take a reference on block ``b`` (a matched block a sequence keeps)."""
        if self.pool.refcount[b] == 0 and b in self._nodes:
            self._n_cached -= 1
            self._evictable.discard(b)
        self.pool.incref(b)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a sequence's references; unindexed blocks are freed, then the budget holds."""
        for b in blocks:
            if self.pool.decref(b) == 0:
                if b not in self._nodes:
                    self._free(b)
                    continue
                self._n_cached += 1
                if self._nodes[b].children == 0:
                    self._evictable.add(b)
        self.enforce_budget()

    def num_cached(self) -> int:
        """Indexed blocks that no sequence references."""
        return self._n_cached

    def enforce_budget(self) -> None:
        """Evict until the cached blocks fit the budget."""
        if self.budget is not None:
            self.evict(self._n_cached - self.budget)

    def evict(self, n: int) -> int:
        """Evict up to ``n`` unreferenced childless blocks, least recently used first
        (evicting a leaf may make its parent evictable in turn)."""
        done = 0
        while done < n and self._evictable:
            leaves = sorted(self._evictable, key=lambda b: self._nodes[b].last_used)
            for b in leaves[: n - done]:
                self._remove(b)
                done += 1
        self.stats.evictions += done
        return done

    def allocate(self) -> int:
        """A fresh block, evicting cached blocks if the pool is full."""
        if self.pool.num_free == 0 and not self.evict(1):
            raise OutOfBlocks("KV pool exhausted: every block is held by a running sequence")
        return self.pool.allocate()

    def drop_key(self, pred: Callable[[CacheKey], bool]) -> None:
        """Un-index every block computed under a key that satisfies ``pred(key)`` at one of
        its positions, with every block that follows it (adapter unload)."""
        doomed: dict[int, bool] = {}

        def is_doomed(b: int) -> bool:
            if b not in doomed:
                node = self._nodes[b]
                up = isinstance(node.parent, int) and is_doomed(node.parent)
                doomed[b] = up or any(pred(k) for _, k in node.bkey)  # type: ignore[arg-type]
            return doomed[b]

        gone = [b for b in self._nodes if is_doomed(b)]
        for b in sorted(gone, key=lambda b: -self._depth(b)):
            self._remove(b)

    def _depth(self, b: int) -> int:
        d, p = 0, self._nodes[b].parent
        while isinstance(p, int):
            d, p = d + 1, self._nodes[p].parent
        return d

    def _remove(self, b: int) -> None:
        node = self._nodes.pop(b)
        self._evictable.discard(b)
        kids = self._children[node.slot]
        del kids[(node.bkey, node.tokens)]
        if not kids:
            del self._children[node.slot]
        if isinstance(node.parent, int):
            parent = self._nodes[node.parent]
            parent.children -= 1
            if parent.children == 0 and self.pool.refcount[node.parent] == 0:
                self._evictable.add(node.parent)
        if self.pool.refcount[b] == 0:
            self._n_cached -= 1
            self._free(b)

    def _free(self, b: int) -> None:
        self.pool.free(b)
        if self.states is not None:
            self.states.drop(b)

    def check(self) -> None:
        """Assert the index invariants (used by tests)."""
        self.pool.check()
        n_kids: dict[int, int] = {}
        for b, node in self._nodes.items():
            assert b in self.pool._used, f"indexed block {b} is free"
            assert self._children[node.slot][(node.bkey, node.tokens)] == b
            assert node.bkey and node.bkey[0][0] == 0 and _head(node.bkey, len(node.tokens))
            if isinstance(node.parent, int):
                assert (
                    node.parent in self._nodes and len(self._nodes[node.parent].tokens) == self.bs
                )
                n_kids[node.parent] = n_kids.get(node.parent, 0) + 1
        assert sum(len(k) for k in self._children.values()) == len(self._nodes)
        for b, node in self._nodes.items():
            n = n_kids.get(b, 0)
            assert n == node.children, f"block {b} child count {node.children} != {n}"
        cached = {b for b in self._nodes if self.pool.refcount[b] == 0}
        assert self._n_cached == len(cached), "cached count out of step"
        assert self._evictable == {b for b in cached if self._nodes[b].children == 0}
        if self.budget is not None:
            # over the budget only while no cached block can go: a cached block whose child
            # is held (a twin's chain extended by another sequence) waits for that child
            assert self.num_cached() <= self.budget or not self._evictable, "budget exceeded"


def _common_prefix(toks: tuple[int, ...], tokens: Sequence[int], start: int, limit: int) -> int:
    n = 0
    for t in toks:
        if start + n >= limit or tokens[start + n] != t:
            break
        n += 1
    return n
