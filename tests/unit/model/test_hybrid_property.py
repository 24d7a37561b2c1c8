"""The cache promise on recurrent and hybrid models, by hypothesis (issue 28): random request
sequences with shared prefixes under random adapter mixes (per request and global switches),
random prefill chunk sizes, cache budgets, slot counts, checkpoint bounds and snapshot
intervals; every answer (tokens and top-2 probabilities) equals its cache-off answer, bit for
bit, and no recurrent state is ever read under another cache key or after other tokens.

That last part is checked by an oracle of its own (`StateGuard`), not by the cache's
bookkeeping: it records, for every state a step produces (a block's snapshot, a checkpoint,
a sequence's live state), the cache key and the tokens of the request that computed it, and
for every state a step starts from, that those are the reading request's key and tokens.

`test_cache_on_equals_cache_off` runs on every recorded recurrent architecture and variant
(delta-net, Mamba-1/2, short convolution; dense, MoE, latent MoE), `..._any_interval` adds
``-cms`` on the hybrids with attention, `test_chunked_form_...` runs the delta-net and Mamba-2
models with their scans in the chunked form.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraserve.cache.state import SeqStep, StateStore
from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.lora.adapter_write import write_gguf_lora
from tests.engine_util import ask
from tests.unit.model.archs_util import PROBS, case_id
from tests.unit.model.recurrent_util import (
    CHUNK_TEST,
    RECORDS,
    RECURRENT_STEMS,
    SCANNED,
    VARIANTS,
    answers,
    model,
    stem_adapter,
)

STEMS = [[5, 9, 14, 2, 77, 31, 8, 8, 100, 64, 3], [5, 9, 14, 2, 77, 6], [40] * 9]
request = st.tuples(
    st.integers(0, len(STEMS) - 1),
    st.lists(st.integers(0, 127), max_size=6),  # own tail after the shared stem
    st.sampled_from([None, {0: 0.5}, {1: -0.7}, {0: 1.0, 1: 0.5}]),  # None: the global mix
)
action = st.one_of(
    st.lists(request, min_size=1, max_size=4),  # requests submitted together
    st.sampled_from([[(0, 0.0), (1, 0.0)], [(0, 0.8)], [(0, 0.5), (1, -0.7)]]),  # global switch
)
ARCHS = [a for a in ("jamba", "falcon-h1", "nemotron_h") if a in RECORDS]
Origin = tuple[object, tuple[int, ...]]  # (cache key, the tokens before the state)


class StateGuard:
    """Wraps an engine's `StateStore` to record where each state came from and check every
    read (violations collected in ``bad``)."""

    def __init__(self, eng: Engine) -> None:
        self.eng, self.bad = eng, []  # type: list[str]
        store = eng.core.runner.states
        assert store is not None
        self.store: StateStore = store
        self.snap: dict[int, Origin] = {}  # block -> origin of the snapshot after it
        self.seq: dict[int, Origin] = {}  # request id -> its key and tokens so far
        self.adopted: dict[int, Origin] = {}  # request id -> origin of the state it adopted
        self.ckpt: dict[int, dict[int, Origin]] = {}  # slot -> position -> its checkpoint's
        prepare, adopt = store.prepare, store.adopt

        def _prepare(slot: int, seq: int, start: int, n: int, blocks: Any, lo: int,
                     end: int = -1) -> SeqStep:  # fmt: skip
            key, toks = self._run(seq)
            live = store.live.get(slot)
            here = (key, toks[:start])
            if start == 0:
                pass
            elif live is not None and live.seq == seq and start in live.at:
                got = self.adopted.get(seq)
                if got is not None and len(got[1]) == start and got != here:
                    self.bad.append(f"request {seq} adopted a state of {got} at {start}")
            else:
                b = blocks[start // store.bs - 1]
                if self.snap.get(b, here) != here:
                    self.bad.append(f"request {seq} read block {b}'s snapshot of {self.snap[b]}")
            step = prepare(slot, seq, start, n, blocks, lo, end)
            for r, b in step.cuts:  # a block's snapshot, or (b < 0) the slot's checkpoint
                where = self.snap if b >= 0 else self.ckpt.setdefault(slot, {})
                where[b if b >= 0 else -1 - b] = (key, toks[: start + r + 1])
            return step

        def _adopt(slot: int, seq: int, new_seq: int, at: int) -> bool:
            live = store.live.get(slot)
            end = live is not None and at in live.at
            ok = adopt(slot, seq, new_seq, at)
            if ok:  # the state at the old sequence's end, or at one of the slot's checkpoints
                got = self.seq[seq] if end else self.ckpt[slot][at]
                self.adopted[new_seq] = self.ckpt.setdefault(slot, {})[at] = (got[0], got[1][:at])
            return ok

        store.prepare, store.adopt = _prepare, _adopt  # type: ignore[method-assign]

    def _run(self, seq: int) -> tuple[object, tuple[int, ...]]:
        run = next(r for r in self.eng.core.scheduler.running if r.req.id == seq)
        self.seq[seq] = (run.req.cache_key, tuple(run.tokens))
        return self.seq[seq]


def check_cache_on_equals_off(
    tmp: Path, arch: str, variant: str, actions: list, n_slots: int, chunk: int = 0,
    **flags: Any,
) -> None:  # fmt: skip
    """Run `actions` (requests under adapter mixes, global switches) on an engine with the
    cache and `flags`; every answer equals the same request's on a cache-off engine, every
    state read is of the reader's key and tokens (`StateGuard`), and the cache's invariants
    hold after each round. ``chunk`` > 0: the model's scans in the chunked form."""
    m = model(tmp, arch, variant, scan_chunk=chunk)
    rec = RECORDS[arch]["variants"][variant]
    paths = []
    for seed in (1, 2):
        p = tmp / f"{arch}-{variant}-prop{seed}.gguf"
        if not p.exists():
            pairs = stem_adapter(rec, seed, RECURRENT_STEMS + ("attn_q", "attn_v", "ffn_up"))
            name = RECORDS[arch]["arch"]  # the record's (nemotron_h_moe+latent: nemotron_h_moe)
            write_gguf_lora(p, name, pairs, qk_heads=(m.config.n_heads,) * 2)
        paths.append(p)
    cfg = EngineConfig(n_slots=n_slots, n_ctx=n_slots * 64, block_size=4, **flags)
    eng = Engine(m, cfg)
    ref = Engine(m, EngineConfig(n_slots=1, n_ctx=64, block_size=4))
    for e in (eng, ref):
        for p in paths:
            e.load_adapter(p, 0.0).result()
    guard = StateGuard(eng)
    scales: dict[int, float] = {0: 0.0, 1: 0.0}
    for act in actions:
        if len(act[0]) == 2:  # a global switch (unlisted adapters 0)
            eng.set_global_scales(act).result()
            scales = {0: 0.0, 1: 0.0, **dict(act)}
            continue
        asks, refs = [], []
        for stem, tail, mix in act:
            prompt = STEMS[stem] + tail
            eff = dict(scales) if not mix else {0: 0.0, 1: 0.0, **mix}  # {}: the global ones
            asks.append(ask(prompt, 3, mix, sampling=PROBS))
            refs.append(ask(prompt, 3, list(eff.items()), sampling=PROBS, cache_prompt=False))
        got = answers(eng, asks)
        want = [answers(ref, [r])[0] for r in refs]
        assert not guard.bad, guard.bad
        assert [g[:2] for g in got] == [w[:2] for w in want]
        eng.core.cache.check()


@pytest.mark.skipif(not VARIANTS, reason="no recorded recurrent architecture")
@pytest.mark.parametrize("arch,variant", VARIANTS, ids=map(case_id, VARIANTS))
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(action, min_size=1, max_size=5),
    st.sampled_from([2, 5, 16]),  # prefill chunk (ubatch)
    st.sampled_from([0.0, 0.05, 8.0]),  # --cache-ram MiB: nothing, a few blocks, plenty
    st.integers(1, 3),  # slots
    st.sampled_from([0, 1, 32]),  # --ctx-checkpoints
)
def test_cache_on_equals_cache_off(
    tmp: Path, arch: str, variant: str, actions: list, ubatch: int, cache_mib: float,
    n_slots: int, ckpts: int,
) -> None:  # fmt: skip
    check_cache_on_equals_off(tmp, arch, variant, actions, n_slots, ubatch=ubatch,
                              cache_ram_mib=cache_mib, ctx_checkpoints=ckpts)  # fmt: skip


@pytest.mark.skipif(not SCANNED, reason="no recorded delta-net or Mamba-2 architecture")
@pytest.mark.parametrize("arch,variant", SCANNED, ids=map(case_id, SCANNED))
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(action, min_size=1, max_size=5),
    st.sampled_from([2, 5, 16]),  # prefill chunk (ubatch): cuts inside scan chunks
    st.sampled_from([0.0, 0.05, 8.0]),  # --cache-ram MiB
    st.integers(1, 3),  # slots
    st.sampled_from([0, 32]),  # --ctx-checkpoints
    st.sampled_from([CHUNK_TEST, 4]),  # scan chunks ending inside blocks, or with them
)
def test_chunked_form_cache_on_equals_cache_off(
    tmp: Path, arch: str, variant: str, actions: list, ubatch: int, cache_mib: float,
    n_slots: int, ckpts: int, chunk: int,
) -> None:  # fmt: skip
    """The same in the chunked form of the scans: carried records (a chunk's start state
    and its pending rows) resume exactly from any snapshot, checkpoint or live state."""
    check_cache_on_equals_off(tmp, arch, variant, actions, n_slots, chunk, ubatch=ubatch,
                              cache_ram_mib=cache_mib, ctx_checkpoints=ckpts)  # fmt: skip


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("property")


@pytest.mark.skipif(not ARCHS, reason="no recorded hybrid architecture")
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(action, min_size=1, max_size=5),
    st.sampled_from([2, 5, 16]),  # prefill chunk (ubatch)
    st.sampled_from([0.0, 0.05, 8.0]),  # --cache-ram MiB: nothing, a few blocks, plenty
    st.integers(1, 3),  # slots
    st.sampled_from([0, 4, 8, 12, 8192]),  # -cms: every block, 1-3 blocks, prompt ends only
    st.sampled_from([2, 32]),  # --ctx-checkpoints: 2 thins checkpoints within -cms of another
    st.sampled_from(ARCHS or ["none"]),
)
def test_cache_on_equals_cache_off_any_interval(
    tmp: Path, actions: list, ubatch: int, cache_mib: float, n_slots: int, cms: int,
    ckpts: int, arch: str,
) -> None:  # fmt: skip
    check_cache_on_equals_off(tmp, arch, "dense", actions, n_slots, ubatch=ubatch,
                              cache_ram_mib=cache_mib, checkpoint_min_step=cms,
                              ctx_checkpoints=ckpts)  # fmt: skip
