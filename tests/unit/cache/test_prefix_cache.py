"""The prefix cache never returns KV computed under another cache key or another prefix.

Each block records, per token slot, the keys of every position up to it and the token
prefix it was computed for — a stand-in for real KV (a key may change along a sequence,
`Spans`: an aLoRA adapter acts from its invocation on, so a base conversation and an aLoRA
continuation share the KV before the invocation, both ways). Random operation sequences
(hypothesis) then check that every match only reuses slots computed for exactly the
requested keys and prefix, that the index and pool invariants hold, and (with an
unlimited budget) that the match is the longest prefix ever computed under the same key at
every position. A sequence may also write the KV of a
rejected speculative draft past its tokens and roll it back as the engine does (the blocks
wholly past its tokens released, the rest never indexed beyond them): no match may ever
return such a slot.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loraserve.cache.block_pool import BlockPool
from loraserve.cache.prefix_cache import PrefixCache, Spans, spans

BS = 4
PLAIN = [(), (("adapterA", 1.0),), (("adapterA", 0.5),), (("adapterA", 1.0), ("adapterB", -1.0))]
ALORA = (("alora", 1.0),)
KEYS = [
    *PLAIN,
    spans([(0, ()), (3, ALORA)]),  # an aLoRA invoked at position 3, over the base
    spans([(0, ()), (6, ALORA)]),
    spans([(0, PLAIN[1]), (5, (*PLAIN[1], *ALORA))]),  # over another adapter
    spans([(0, ()), (4, ALORA)]),  # invoked at a block boundary
]


def key_at(key, pos: int):
    """The key of position ``pos`` of a sequence under ``key``."""
    if not isinstance(key, Spans):
        return key
    return [k for start, k in key.parts if start <= pos][-1]


def keys_upto(key, i: int) -> tuple:
    return tuple(key_at(key, p) for p in range(i + 1))


class Sim:
    """A minimal engine over the cache: sequences with recorded per-slot 'KV'."""

    def __init__(self, budget: int | None) -> None:
        self.pool = BlockPool(BS, max_blocks=4096)
        self.cache = PrefixCache(self.pool, budget)
        self.kv: dict[tuple[int, int], tuple] = {}  # (block, offset) -> (key, prefix)
        self.retained: list[list[int]] = []  # block lists held by "idle slots"
        self.history: list[tuple[tuple, tuple[int, ...]]] = []

    def run(
        self, key: tuple, prompt: list[int], n_gen: int, cache_prompt: bool, n_draft: int = 0
    ) -> int:
        limit = len(prompt) - 1 if cache_prompt else 0
        m = self.cache.match(key, prompt, limit) if limit > 0 else None
        blocks: list[int] = []
        n = 0
        if m is not None:
            for b in m.blocks:
                self.cache.acquire(b)
            blocks = list(m.blocks)
            if m.partial_block is not None:
                dst = self.cache.allocate()
                for off in range(m.partial_len):
                    self.kv[(dst, off)] = self.kv[(m.partial_block, off)]
                blocks.append(dst)
            n = m.n_tokens
        # soundness: every reused slot was computed for this key and this exact prefix
        for i in range(n):
            want = (keys_upto(key, i), tuple(prompt[: i + 1]))
            assert self.kv[(blocks[i // BS], i % BS)] == want, "stale KV"
        tokens = list(prompt) + [1000 + j for j in range(n_gen)]
        n_kv = len(tokens) - 1 if n_gen else len(tokens)
        for i in range(n, n_kv):
            if i // BS >= len(blocks):
                blocks.append(self.cache.allocate())
            self.kv[(blocks[i // BS], i % BS)] = (keys_upto(key, i), tuple(tokens[: i + 1]))
        for i in range(n_kv, n_kv + n_draft):  # a rejected draft's rows: KV of other tokens
            if i // BS >= len(blocks):
                blocks.append(self.cache.allocate())
            self.kv[(blocks[i // BS], i % BS)] = (keys_upto(key, i), (*tokens[:n_kv], -1, i))
        keep = (n_kv + BS - 1) // BS  # the rollback (`engine/spec/verify.py`)
        self.cache.release(blocks[keep:])
        del blocks[keep:]
        self.cache.insert(key, tokens[:n_kv], blocks)
        self.history.append((key, tuple(tokens[:n_kv])))
        self.retained.append(blocks)
        return n

    def release_oldest(self) -> None:
        if self.retained:
            self.cache.release(self.retained.pop(0))


ops = st.lists(
    st.tuples(
        st.sampled_from(range(len(KEYS))),
        st.lists(st.integers(0, 3), min_size=1, max_size=14),  # small alphabet: shared prefixes
        st.integers(0, 5),
        st.booleans(),
        st.booleans(),  # release the oldest retained sequence first
        st.sampled_from([0, 0, 1, 3, 6]),  # rejected draft tokens written, then rolled back
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.sampled_from([None, 0, 2, 8]))
def test_matches_are_never_stale(seq_ops, budget) -> None:
    sim = Sim(budget)
    for k, prompt, n_gen, cache_prompt, release, n_draft in seq_ops:
        if release:
            sim.release_oldest()
        sim.run(KEYS[k], prompt, n_gen, cache_prompt, n_draft)
        sim.cache.check()
    while sim.retained:
        sim.release_oldest()
    sim.cache.check()
    if budget is not None:
        assert sim.pool.num_used <= budget


@settings(max_examples=150, deadline=None)
@given(ops)
def test_unlimited_match_is_longest_computed_prefix(seq_ops) -> None:
    sim = Sim(None)
    for k, prompt, n_gen, cache_prompt, release, n_draft in seq_ops:
        if release:
            sim.release_oldest()
        key = KEYS[k]
        limit = len(prompt) - 1 if cache_prompt else 0
        expect = 0
        for hkey, htoks in sim.history:
            n = 0
            while (
                n < min(limit, len(htoks))
                and htoks[n] == prompt[n]
                and key_at(hkey, n) == key_at(key, n)
            ):
                n += 1
            expect = max(expect, n)
        assert sim.run(key, prompt, n_gen, cache_prompt, n_draft) == expect


def test_budget_zero_frees_unheld_blocks_and_lru_order() -> None:
    sim = Sim(0)
    sim.run((), [1, 2, 3, 4, 5, 6], 0, True)
    sim.release_oldest()
    assert sim.pool.num_used == 0 and sim.cache.stats.evictions > 0
    sim2 = Sim(2)  # room for two blocks: the least recently used goes first
    sim2.run((), [1, 1, 1, 1], 0, True)
    sim2.run((), [2, 2, 2, 2], 0, True)
    sim2.release_oldest()
    sim2.release_oldest()
    sim2.run((), [1, 1, 1, 1, 9], 0, True)  # touches block [1,1,1,1]
    sim2.release_oldest()  # now 3 cached blocks > 2: [2,2,2,2] is the LRU leaf
    assert sim2.cache.match((), [2, 2, 2, 2, 0], 4).n_tokens == 0
    assert sim2.cache.match((), [1, 1, 1, 1, 9, 0], 5).n_tokens == 5


def test_keys_are_separate_namespaces() -> None:
    sim = Sim(None)
    sim.run(KEYS[1], [5, 6, 7, 8, 9], 0, True)
    assert sim.cache.match(KEYS[0], [5, 6, 7, 8, 9, 1], 5).n_tokens == 0
    assert sim.cache.match(KEYS[2], [5, 6, 7, 8, 9, 1], 5).n_tokens == 0
    assert sim.cache.match(KEYS[1], [5, 6, 7, 8, 9, 1], 5).n_tokens == 5


def test_drop_key_unindexes_only_that_key() -> None:
    sim = Sim(None)
    sim.run(KEYS[1], [5, 6, 7, 8, 9], 0, True)
    sim.run(KEYS[0], [5, 6, 7, 8, 9], 0, True)
    sim.cache.drop_key(lambda key: any(cid == "adapterA" for cid, _ in key))
    sim.cache.check()
    assert sim.cache.match(KEYS[1], [5, 6, 7, 8, 9, 1], 5).n_tokens == 0
    assert sim.cache.match(KEYS[0], [5, 6, 7, 8, 9, 1], 5).n_tokens == 5
