"""Speculative decoding never changes an answer: on the tiny model, greedy answers with
every spec type, with and without adapter mixes, alone and concurrent, are the tokens (and
n_probs probabilities) of speculation off; seeded sampled answers are the same tokens too,
and over a fixed set of seeds the token frequencies match speculation off (chi-square).
The drafts are real: the suite checks that drafts were both accepted and rejected."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
from scipy.stats import chi2_contingency

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecConfig, SpecRequest
from tests.engine_util import ask, tokens
from tests.server_util import tiny_model
from tests.unit.engine.spec_util import (
    BOTH,
    GREEDY,
    MIXES,
    MOD,
    SEEDED,
    SIMPLE,
    adapter_dir,
    answers,
    copy_prompts,
    drafted,
    run_and_drain,
    seeded,
)

SPECS = {"ngram-simple": SIMPLE, "ngram-mod": MOD, "both": BOTH}
PENALIZED = dataclasses.replace(SEEDED, repeat_penalty=1.05, presence_penalty=0.1)


def engine(spec: SpecConfig, n_slots: int = 4, **kw: Any) -> Engine:
    eng = Engine(tiny_model(), EngineConfig(n_slots=n_slots, n_ctx=256 * n_slots, spec=spec, **kw))
    for name in ("a", "b"):
        eng.load_adapter(adapter_dir() / name, 0.0).result()
    return eng


def asks(mixed: bool, sampling: SamplingParams = GREEDY) -> list[dict[str, Any]]:
    return [
        ask(p, 40, MIXES[i % len(MIXES)] if mixed else None, sampling=sampling)
        for i, p in enumerate(copy_prompts(7, 6))
    ]


@pytest.mark.parametrize("concurrent", [False, True], ids=["alone", "concurrent"])
@pytest.mark.parametrize("mixed", [False, True], ids=["base", "mixed"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_greedy_answers_equal_speculation_off(kind: str, mixed: bool, concurrent: bool) -> None:
    """`ignore_eos` makes the rows go through the sampling chain one depth at a time."""
    todo = asks(mixed)
    off = answers(engine(SpecConfig()), todo, concurrent)
    on = answers(engine(SPECS[kind]), todo, concurrent)
    assert [tokens(e) for e in on] == [tokens(e) for e in off]
    n, accepted = drafted(on)
    assert 0 < accepted < n, "drafts must be both accepted and rejected"
    assert drafted(off) == (0, 0)


@pytest.mark.parametrize("kind", list(SPECS))
def test_plain_greedy_answers_equal_speculation_off(kind: str) -> None:
    """Plain greedy rows (no penalty, bias, probabilities or grammar) are verified with one
    argmax over the step; end-of-generation tokens end answers as without drafts."""
    todo = asks(True, SamplingParams(temperature=0.0)) + asks(
        False, SamplingParams(temperature=0.0)
    )
    off = answers(engine(SpecConfig()), todo, True)
    on = answers(engine(SPECS[kind]), todo, True)
    assert [tokens(e) for e in on] == [tokens(e) for e in off]
    assert [e[-1].stop_type for e in on] == [e[-1].stop_type for e in off]
    n, accepted = drafted(on)
    assert 0 < accepted < n


def test_probabilities_equal_speculation_off() -> None:
    """n_probs (raw and post-sampling) at every token are the same floats."""
    for post in (False, True):
        sampling = dataclasses.replace(GREEDY, n_probs=3, post_sampling_probs=post)
        todo = asks(True, sampling)
        off = answers(engine(SpecConfig()), todo, True)
        on = answers(engine(BOTH), todo, True)
        for a, b in zip(on, off, strict=True):
            assert [(e.token, e.probs, e.prob) for e in a] == [
                (e.token, e.probs, e.prob) for e in b
            ]


@pytest.mark.parametrize("kind", list(SPECS))
def test_seeded_sampling_gives_the_same_tokens(kind: str) -> None:
    """The rejection rule draws the target's token with the request's generator, one draw per
    token kept: a seed decides the tokens whatever the speculation (and the batch)."""
    accepted = {}
    for sampling in (SEEDED, PENALIZED):  # penalties: each row sees the window before it
        todo = [
            ask(p, 40, MIXES[i % 4], sampling=seeded(sampling, 100 + i))
            for i, p in enumerate(copy_prompts(3, 8))
        ]
        off = answers(engine(SpecConfig()), todo, True)
        on = answers(engine(SPECS[kind]), todo, True)
        assert [tokens(e) for e in on] == [tokens(e) for e in off]
        assert drafted(on)[0] > 0
        accepted[sampling] = drafted(on)[1]
    assert accepted[SEEDED] > 0


def test_sampled_token_frequencies_match_speculation_off() -> None:
    """Two independent samples (different fixed seed sets): the frequency of each generated
    token with speculation on is that of speculation off (chi-square homogeneity test)."""
    prompt = copy_prompts(11, 1)[0]
    sampling = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)

    def counts(spec: SpecConfig, seeds: range) -> tuple[Counter[int], int]:
        eng = engine(spec)
        todo = [ask(prompt, 8, sampling=seeded(sampling, s)) for s in seeds]
        evs = run_and_drain(eng, todo)
        return Counter(t for e in evs for t in tokens(e)), drafted(evs)[0]

    on, n_drafted = counts(MOD, range(0, 240))
    off, _ = counts(SpecConfig(), range(10_000, 10_240))
    assert n_drafted > 0
    common = [t for t in set(on) | set(off) if on[t] + off[t] >= 10]  # chi-square's condition
    rare = (
        sum(on.values()) - sum(on[t] for t in common),
        sum(off.values()) - sum(off[t] for t in common),
    )
    table = [[on[t] for t in common] + [rare[0]], [off[t] for t in common] + [rare[1]]]
    _, p, _, _ = chi2_contingency(table)
    assert p > 1e-3, f"token frequencies differ with speculation on (p = {p:.2e})"


def test_request_fields_turn_speculation_down() -> None:
    todo = asks(False)
    on = answers(engine(BOTH), [{**a, "spec": SpecRequest(n_max=0)} for a in todo], True)
    assert drafted(on) == (0, 0)
    on = answers(engine(BOTH), [{**a, "spec": SpecRequest(n_max=1)} for a in todo], True)
    off = answers(engine(SpecConfig()), todo, True)
    assert [tokens(e) for e in on] == [tokens(e) for e in off]
    n, _ = drafted(on)
    assert n > 0 and all(e[-1].timings.draft_n <= 40 for e in on)


def test_ngram_mod_pools_never_mix_cache_keys() -> None:
    """Every n-gram in a cache key's pool comes from a request under that key (its prompt
    or output): one adapter configuration's text never drafts for another's."""
    eng = engine(MOD)
    todo = asks(True)
    evs = run_and_drain(eng, todo)
    texts: dict[tuple, list[list[int]]] = {}
    for a, e in zip(todo, evs, strict=True):
        key = eng.core.adapters.mix(a.get("lora"), None, False).cache_key
        texts.setdefault(key, []).append(a["prompts"][0] + tokens(e))
    pools = eng.core.spec.mod.pools
    assert set(pools) == set(texts) and len(pools) == len(MIXES)
    for key, pool in pools.items():
        grams = {tuple(t[i : i + pool.n + 1]) for t in texts[key] for i in range(len(t))}
        assert pool.table and {(*g, nxt) for g, nxt in pool.table.items()} <= grams


def test_unloading_an_adapter_drops_its_pools() -> None:
    eng = engine(MOD)
    run_and_drain(eng, [a for a in asks(True)[:3]])  # base, adapter 0, adapter 1
    keys = set(eng.core.spec.mod.pools)
    assert len(keys) == 3
    cid = eng.core.adapters.get(0).content_id
    eng.unload_adapter(0).result()
    left = set(eng.core.spec.mod.pools)
    (dropped,) = keys - left
    assert left < keys and cid in dict(dropped)
