"""KV and prefix-cache invariants under speculative decoding (hypothesis): random batches of
requests (repetitive prompts over a small alphabet, so drafts are accepted and rejected;
shared prefixes, adapter mixes, cache on and off, a small cache budget that evicts; greedy
plain and through the sampling chain, and seeded) run with speculation on. After every
engine step each running sequence's block table covers exactly the tokens whose KV is
computed (a rejected draft's blocks went back to the pool), and the pool and index
invariants hold (`PrefixCache.check`); every answer equals the same request alone with
speculation and the cache off, so no rejected row's KV was ever reused."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecConfig
from tests.engine_util import tokens
from tests.server_util import tiny_model
from tests.unit.engine.spec_util import BOTH, MIXES, adapter_dir, run_and_drain

BS = 4
SAMPLINGS = (  # plain greedy (one argmax for a whole draft), and through the sampling chain
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, ignore_eos=True),
    SamplingParams(temperature=0.7, seed=3, repeat_penalty=1.1),
)


def make(spec: SpecConfig, cache_ram_mib: float) -> Engine:
    cfg = EngineConfig(
        n_slots=3, n_ctx=3 * 128, block_size=BS, cache_ram_mib=cache_ram_mib, ubatch=24, spec=spec
    )
    eng = Engine(tiny_model(), cfg)
    for name in ("a", "b"):
        eng.load_adapter(adapter_dir() / name, 0.0).result()
    return eng


@functools.cache
def reference_engine() -> Engine:
    return make(SpecConfig(), 0)


@functools.cache
def reference(prompt: tuple[int, ...], mix: int, n: int, sampling: int) -> tuple[int, ...]:
    """Tokens of the request alone, speculation and cache off."""
    ask = _ask(list(prompt), mix, n, cache_prompt=False, sampling=sampling)
    return tuple(tokens(run_and_drain(reference_engine(), [ask])[0]))


def _ask(prompt: list[int], mix: int, n: int, cache_prompt: bool, sampling: int) -> dict:
    m = MIXES[mix]
    lora = list(m.items()) if m else None
    sp = SAMPLINGS[sampling]
    return dict(prompts=[prompt], sampling=sp, max_tokens=n, lora=lora, cache_prompt=cache_prompt)


request = st.tuples(
    st.lists(st.integers(3, 8), min_size=2, max_size=6),  # a phrase, repeated below
    st.integers(1, 4),  # repeats
    st.integers(0, len(MIXES) - 1),
    st.integers(1, 14),  # n_predict
    st.booleans(),  # cache_prompt
    st.integers(0, len(SAMPLINGS) - 1),
)


def check_tables(eng: Engine) -> None:
    for run in eng.core.scheduler.running:
        assert len(run.blocks) == (run.n_computed + BS - 1) // BS, "block table past its KV"
        if not run.prefilling:
            assert run.n_computed == len(run.tokens) - 1
        assert run.draft == [], "a draft outlived its verification"
    eng.core.cache.check()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.lists(request, min_size=1, max_size=3), min_size=1, max_size=5), st.booleans())
def test_rollback_keeps_block_tables_and_cache_exact(batches, small_budget) -> None:
    eng = make(BOTH, 0.02 if small_budget else -1)  # 0.02 MiB: a few blocks, evicting
    n_drafted = 0
    for batch in batches:
        asks = [_ask([1, *phrase * rep], mix, n, cp, sp) for phrase, rep, mix, n, cp, sp in batch]
        reqs = [eng.submit(**a).requests[0] for a in asks]
        while eng.step() or eng.busy:
            check_tables(eng)
        for r, (phrase, rep, mix, n, _, sp) in zip(reqs, batch, strict=True):
            evs = []
            while not r.events.empty():
                evs.append(r.events.get())
            assert evs[-1].done and evs[-1].error is None
            assert tuple(tokens(evs)) == reference(tuple([1, *phrase * rep]), mix, n, sp)
            n_drafted += evs[-1].timings.draft_n
        check_tables(eng)
        for slot in eng.core.scheduler.slots:
            assert len(slot.blocks) == (len(slot.tokens) + BS - 1) // BS
