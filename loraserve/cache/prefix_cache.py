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
  that has a state snapshot (the exact state there, under the same key: the latest at or
  before the hit; the rest is recomputed), and a block's snapshot is dropped when the block
  is freed. The budget is then in units of one block's KV and one snapshot: a cached block
  costs the unit with a snapshot, its KV's share without (`StateStore.kv_share`), counted as it
  becomes cached (its snapshot never changes while it is).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence

from loraserve.cache.block_pool import BlockPool, OutOfBlocks
from loraserve.cache.index_records import CacheStats, Match, _common_prefix, _Node, check_index
from loraserve.cache.keys import (
    SALT_TAG,
    BlockKey,
    CacheKey,
    Spans,
    _head,
    block_key,
    salted,
    spans,
)
from loraserve.cache.state import StateStore

__all__ = [
    "ROOT",
    "SALT_TAG",
    "BlockKey",
    "CacheKey",
    "CacheStats",
    "Match",
    "PrefixCache",
    "Spans",
    "block_key",
    "salted",
    "spans",
]

Parent = int | str  # block id, or ROOT
ROOT = "root"


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
        self._snap_cached: set[int] = set()  # ...of them, those that carry a state snapshot
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
                    self._count(b)
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
            self._uncount(b)
            self._evictable.discard(b)
        self.pool.incref(b)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a sequence's references; unindexed blocks are freed, then the budget holds."""
        for b in blocks:
            if self.pool.decref(b) == 0:
                if b not in self._nodes:
                    self._free(b)
                    continue
                self._count(b)
                if self._nodes[b].children == 0:
                    self._evictable.add(b)
        self.enforce_budget()

    def num_cached(self) -> int:
        """Indexed blocks that no sequence references."""
        return self._n_cached

    def _count(self, b: int) -> None:
        self._n_cached += 1
        if self.states is not None and self.states.has(b):
            self._snap_cached.add(b)

    def _uncount(self, b: int) -> None:
        self._n_cached -= 1
        self._snap_cached.discard(b)

    def cached_cost(self) -> float:
        """The cached blocks' cost in budget units (their number without recurrent states)."""
        if self.states is None:
            return float(self._n_cached)
        share = self.states.kv_share  # a block without a snapshot
        n_snap = len(self._snap_cached)  # and each slot's checkpoints: a snapshot's share
        return n_snap + (self._n_cached - n_snap) * share + self.states.n_checkpoints * (1 - share)

    def enforce_budget(self) -> None:
        """Evict until the cached blocks fit the budget."""
        if self.budget is None:
            return
        if self.states is None:
            self.evict(self._n_cached - self.budget)
            return
        while self.cached_cost() > self.budget + 1e-9 and self.states.n_checkpoints:
            self.states.drop_checkpoint()  # checkpoints first (`StateStore.drop_checkpoint`)
        done = 0  # least recently used first, until the cost fits
        while self.cached_cost() > self.budget + 1e-9 and self._evictable:
            self._remove(min(self._evictable, key=lambda b: self._nodes[b].last_used))
            done += 1
        self.stats.evictions += done

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
            self._uncount(b)
            self._free(b)

    def _free(self, b: int) -> None:
        self.pool.free(b)
        if self.states is not None:
            self.states.drop(b)

    def check(self) -> None:
        """Assert the index invariants (used by tests)."""
        check_index(self)
