"""Recurrent state snapshots: a prefix hit resumes from the exact state of that prefix under
the same cache key, or from nothing.

A stand-in state records what produced it: the (key, token) of every position before it, as an
id into a table. Random request sequences (hypothesis) under random keys, shared prefixes and
cache budgets then run as the engine runs them (match, resume, compute block by block with a
snapshot at each boundary, index, release): every resumed state must be the one of exactly the
matched prefix under the request's key, every match must end on a block boundary with a
snapshot, and every snapshot must belong to a block that is in use.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loraserve.cache.block_pool import BlockPool
from loraserve.cache.prefix_cache import PrefixCache
from loraserve.cache.state import StateMissing, StateStore

BS = 4
KEYS = [(), (("adapterA", 1.0),), (("adapterA", 0.5),), (("adapterA", 1.0), ("adapterB", -1.0))]


class Ids:
    """Histories (tuples of (key, token)) <-> small integer ids stored in a state tensor."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {(): 0}
        self.back: list[tuple] = [()]

    def state(self, history: tuple) -> dict[int, torch.Tensor]:
        if history not in self.ids:
            self.ids[history] = len(self.back)
            self.back.append(history)
        return {0: torch.tensor([float(self.ids[history])])}

    def history(self, state: dict[int, torch.Tensor]) -> tuple:
        return self.back[int(state[0][0])]


def test_prepare_cuts_and_reruns() -> None:
    store = StateStore({0: (1,)}, BS)
    blocks = [7, 8, 9]
    step = store.prepare(0, 1, 0, 9, blocks, 0)
    assert float(step.state[0][0]) == 0.0  # zeros at position 0
    assert step.cuts == [(3, 7), (7, 8)]  # after positions 3 and 7: the ends of blocks 7, 8
    step.out[0] = torch.tensor([9.0])
    step.snaps = {7: {0: torch.tensor([4.0])}, 8: {0: torch.tensor([8.0])}}
    store.commit(0, 1, 0, step)
    assert float(store.prepare(0, 1, 9, 1, blocks, 0).state[0][0]) == 9.0  # continues
    assert float(store.prepare(0, 1, 0, 9, blocks, 0).state[0][0]) == 0.0  # a rerun
    # another request in the slot: only a snapshot at a block boundary, never the live state
    assert float(store.prepare(0, 2, 8, 1, blocks, 0).state[0][0]) == 8.0
    with pytest.raises(StateMissing):
        store.prepare(0, 2, 9, 1, blocks, 0)
    store.drop(8)
    with pytest.raises(StateMissing):
        store.prepare(0, 2, 8, 1, blocks, 0)


def test_interval_cuts_every_nth_block_and_each_chunk_end() -> None:
    """With an interval of 3 blocks: a snapshot after blocks 3, 6, ... of the sequence and
    after the last full block of a multi-token step; a one-token step (decode) also at the
    end of each block off the interval, keeping only the latest of those (a chat's next turn
    resumes inside the answer)."""
    store = StateStore({0: (1,)}, BS, every=3)
    blocks = list(range(100, 115))
    got, kept = [], []
    for start, n in ((0, 22), (22, 17), (39, 1), (40, 1), (41, 1), (42, 1), (43, 1), (44, 4)):
        step = store.prepare(0, 1, start, n, blocks, 0)
        got.append(step.cuts)
        step.out = {0: torch.zeros(1)}
        step.snaps = {b: {0: torch.full((1,), float(b))} for _, b in step.cuts}
        store.commit(0, 1, start, step)
        kept.append(sorted(store.snaps))
    assert got[:2] == [[(11, 102), (19, 104)], [(1, 105), (13, 108)]]  # 3rd, end; 6th, 9th
    # decode steps: the 10th and 11th blocks' ends, off the interval: the latest one kept
    assert got[2:7] == [[(0, 109)], [], [], [], [(0, 110)]]
    assert kept[2][-1] == 109 and kept[6] == [102, 104, 105, 108, 110]
    assert got[7] == [(3, 111)]  # the 12th block: on the interval (and the chunk's end)
    assert kept[7] == [102, 104, 105, 108, 110, 111]  # a later chunk drops nothing
    # another request in the slot: the previous one's decode snapshot stays (its blocks are
    # the cache's now)
    step = store.prepare(0, 2, 0, 1, [200], 0)
    step.out = {0: torch.zeros(1)}
    store.commit(0, 2, 0, step)
    assert 110 in store.snaps
    with pytest.raises(ValueError, match="at least 1"):
        StateStore({0: (1,)}, BS, every=0)


def test_draft_end_snapshot_not_kept() -> None:
    """A draft step's (n-gram speculation) cut at its end alone is not kept: its rows may be
    rejected, and the decode step recrossing that boundary would not replace it. A cut on
    the interval is kept (any later crossing cuts there again)."""
    store = StateStore({0: (1,)}, BS, every=2)
    blocks = list(range(10, 20))
    step = store.prepare(0, 1, 0, 2, blocks, 0)  # the prompt's 2 tokens
    step.out = {0: torch.zeros(1)}
    store.commit(0, 1, 0, step)
    step = store.prepare(0, 1, 2, 5, blocks, 0)  # 2..6: crosses the 1st block (end only)
    assert step.cuts == [(1, 10)]
    step.every, step.out, step.snaps = True, {0: torch.zeros(1)}, {10: {0: torch.ones(1)}}
    store.commit(0, 1, 2, step)
    assert not store.has(10)
    step = store.prepare(0, 1, 7, 3, blocks, 0)  # 7..9: crosses the 2nd (on the interval)
    assert step.cuts == [(0, 11)]
    step.every, step.out, step.snaps = True, {0: torch.zeros(1)}, {11: {0: torch.ones(1)}}
    store.commit(0, 1, 7, step)
    assert store.has(11)


def test_budget_counts_snapshots_at_their_bytes() -> None:
    """A cached block costs its KV share of a budget unit (KV + snapshot bytes) without a
    snapshot and the whole unit with one: a budget of 2 units keeps two snapshot blocks, or
    one and all the KV-only blocks whose shares fit."""
    store = StateStore({0: (3,)}, BS, every=4, kv_block_bytes=4)  # snapshot 12 bytes: 1/4
    cache = PrefixCache(BlockPool(BS, 64), 2, store)
    blocks = [cache.allocate() for _ in range(8)]
    for b in (blocks[3], blocks[7]):
        store.snaps[b] = {0: torch.zeros(3)}
    cache.insert((), list(range(32)), blocks)
    cache.release(blocks)  # 2 snapshot blocks (2 units) + 6 KV-only (1.5): over by 1.5
    cache.check()
    assert cache.cached_cost() <= 2
    assert cache.num_cached() == 5  # the last 3 evicted, leaves first: left 1 + 4 x 1/4
    assert store.has(blocks[3]) and not store.has(blocks[7])  # freed with its block


def test_snapshot_counted_in_bytes() -> None:
    assert StateStore({1: (2, 256), 3: (2, 256)}, BS).snapshot_bytes == 2 * 2 * 256 * 4


requests = st.lists(
    st.tuples(
        st.sampled_from(range(len(KEYS))),
        st.integers(0, 2),  # which shared stem
        st.lists(st.integers(0, 3), min_size=1, max_size=11),  # own tail
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=150, deadline=None)
@given(
    requests,
    st.sampled_from([0, 1, 3, None]),
    st.integers(1, 6),
    st.integers(1, 4),  # snapshot interval in blocks
    st.sampled_from([0, 4, 12]),  # KV bytes per block (a snapshot: 4)
)
def test_resumed_state_is_the_prefix_state(
    reqs: list, budget: int | None, ubatch: int, every: int, kv_bytes: int
) -> None:
    stems = [[1, 2, 3, 1, 2, 3, 1, 2, 3], [1, 2, 3, 1, 0, 0], [2] * 10]
    pool = BlockPool(BS, 400)
    store = StateStore({0: (1,)}, BS, every, kv_bytes)
    cache = PrefixCache(pool, budget, store)
    ids = Ids()
    seen: set = set()
    for seq, (k, stem, tail) in enumerate(reqs):
        key, tokens = KEYS[k], stems[stem] + tail
        hist = tuple((key, t) for t in tokens)
        m = cache.match(key, tokens, len(tokens) - 1)
        assert m.partial_block is None and m.n_tokens % BS == 0
        if budget is None and (key, tuple(tokens)) in seen:  # everything kept: a full resume
            full = (len(tokens) - 1) // BS  # ...to the latest snapshot at or before the hit
            assert (
                m.n_tokens == full * BS if every == 1 else m.n_tokens >= full // every * every * BS
            )
        seen.add((key, tuple(tokens)))
        for b in m.blocks:
            cache.acquire(b)
        blocks, pos = list(m.blocks), m.n_tokens
        while pos < len(tokens):  # chunks of ``ubatch`` tokens, as the scheduler makes them
            n = min(ubatch, len(tokens) - pos)
            while len(blocks) * BS < pos + n:
                blocks.append(cache.allocate())
            step = store.prepare(0, seq, pos, n, blocks, 0)
            assert ids.history(step.state) == hist[:pos], "resumed from another prefix's state"
            step.out = ids.state(hist[: pos + n])
            for r, b in step.cuts:
                step.snaps[b] = ids.state(hist[: pos + r + 1])
            store.commit(0, seq, pos, step)
            pos += n
        cache.insert(key, tokens, blocks)
        cache.release(blocks)
        cache.check()
        for b, st_ in store.snaps.items():  # a snapshot lives only with its block
            assert b in pool._used
            assert len(ids.history(st_)) % BS == 0
