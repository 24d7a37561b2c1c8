"""The sampler's spec: llama-server's chain (llama.cpp's common/sampling.cpp and
src/llama-sampler.cpp), checked against an independent reference and by many draws (seeds,
n_probs and validation: tests/unit/sampling/test_sampling_requests.py)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from loraserve.engine.sampling.chain import adjusted_logits, sample_batch
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.sampling.state import SamplerState
from tests.unit.sampling.sampling_util import FAST, PLAIN, final_probs, randn, state


def reference_probs(
    logits: list[float], p: SamplingParams, history: list[int], eog: set[int]
) -> tuple[dict[int, float], float]:
    """llama.cpp's chain, transcribed loop by loop in float64.

    Returns (token -> probability, distance of the closest top_p / min_p decision to its
    threshold) so callers can skip cases that rounding could flip.
    """
    cand = dict(enumerate(logits))
    bias = [(t, -math.inf if b is False else b) for t, b in p.logit_bias]
    bias += [(t, -math.inf) for t in eog] if p.ignore_eos else []
    for t, b in bias:
        cand[t] += b
    if p.penalties_enabled:
        window = history if p.repeat_last_n < 0 else history[-p.repeat_last_n :]
        for t, c in Counter(window).items():
            v = cand[t] * p.repeat_penalty if cand[t] <= 0 else cand[t] / p.repeat_penalty
            cand[t] = v - (c * p.frequency_penalty + p.presence_penalty)
    items = sorted(cand.items(), key=lambda kv: -kv[1])
    if p.temperature <= 0:
        return {items[0][0]: 1.0}, math.inf
    margin = math.inf
    if p.top_k > 0:
        items = items[: p.top_k]
    if p.top_p < 1.0:
        mx = items[0][1]
        mass = [math.exp(v - mx) for _, v in items]
        target, cum = p.top_p * sum(mass), 0.0
        for i, m in enumerate(mass):
            margin = min(margin, abs(cum - target) / max(target, 1e-300))
            cum += m
            if cum >= target:
                items = items[: i + 1]
                break
    if p.min_p > 0.0:
        floor = items[0][1] + math.log(p.min_p)
        margin = min([margin] + [abs(v - floor) for _, v in items if math.isfinite(v)])
        items = [(t, v) for t, v in items if v >= floor]
    scaled = [(t, v / p.temperature) for t, v in items]
    mx = max(v for _, v in scaled)
    mass = {t: math.exp(v - mx) for t, v in scaled}
    total = sum(mass.values())
    return {t: m / total for t, m in mass.items() if m > 0}, margin


def support(probs: torch.Tensor) -> set[int]:
    return set(torch.nonzero(probs > 0).flatten().tolist())


# ---- greedy ------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, -1.0])
@pytest.mark.parametrize("vocab", [7, 1000, 70_000])
def test_greedy_is_argmax(temperature: float, vocab: int) -> None:
    x = randn(5, vocab, seed=vocab)
    states = [state(temperature=temperature) for _ in range(5)]
    out = sample_batch(x, states)
    assert [r.token for r in out] == x.argmax(-1).tolist()
    assert all(r.probs is None for r in out)


def test_greedy_sees_bias_and_penalties_and_ignores_filters() -> None:
    x = torch.tensor([[5.0, 4.0, 3.0, 1.0]])
    banned = state(temperature=0, logit_bias=((0, False),), top_k=1)
    assert sample_batch(x, [banned])[0].token == 1
    penalized = state(prompt=(0, 1), temperature=0, repeat_penalty=2.0)
    assert sample_batch(x, [penalized])[0].token == 2
    assert final_probs(x[0], penalized).tolist() == [0.0, 0.0, 1.0, 0.0]


# ---- the chain's support, analytically and by drawing ------------------------------------


def test_top_k_keeps_exactly_k() -> None:
    x = randn(50, seed=1)
    probs = final_probs(x, state(**{**PLAIN, "top_k": 5}))
    top = torch.topk(x, 5).indices
    assert support(probs) == set(top.tolist())
    assert torch.allclose(probs[top], torch.softmax(x[top].double(), 0))


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    # probs 0.5, 0.25, 0.125, 0.0625, ... : cumulative 0.5, 0.75, 0.875
    x = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625]))
    assert support(final_probs(x, state(**{**PLAIN, "top_p": 0.75}))) == {0, 1}
    assert support(final_probs(x, state(**{**PLAIN, "top_p": 0.76}))) == {0, 1, 2}
    assert support(final_probs(x, state(**{**PLAIN, "top_p": 0.0}))) == {0}
    assert support(final_probs(x, state(**{**PLAIN, "top_p": 1.0}))) == {0, 1, 2, 3, 4}


def test_top_p_and_min_p_boundaries_are_inclusive() -> None:
    # four equal tokens: mass after two is exactly 0.5, so top_p = 0.5 stops there
    assert len(support(final_probs(torch.zeros(4), state(**{**PLAIN, "top_p": 0.5})))) == 2
    # a logit exactly at max + log(min_p) stays (llama.cpp keeps logit >= threshold)
    at_floor = torch.tensor([0.0, math.log(0.1), math.log(0.1) - 1e-3])
    assert support(final_probs(at_floor, state(**{**PLAIN, "min_p": 0.1}))) == {0, 1}


def test_top_p_renormalises_after_top_k() -> None:
    x = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    # within the top 2 (0.4, 0.3): 0.4 / 0.7 = 0.57 < 0.6, so both stay
    assert support(final_probs(x, state(**{**PLAIN, "top_k": 2, "top_p": 0.6}))) == {0, 1}
    assert support(final_probs(x, state(**{**PLAIN, "top_p": 0.4}))) == {0}


def test_min_p_is_relative_to_the_top_token_before_temperature() -> None:
    x = torch.log(torch.tensor([0.5, 0.2, 0.04, 0.26]))
    st_ = state(**{**PLAIN, "min_p": 0.1, "temperature": 5.0})  # threshold 0.05: drops 0.04
    probs = final_probs(x, st_)
    assert support(probs) == {0, 1, 3}
    expected = torch.softmax(x[[0, 1, 3]].double() / 5.0, 0)
    assert torch.allclose(probs[[0, 1, 3]], expected)


def test_top_p_without_top_k_beyond_the_probe_sorts_the_row() -> None:
    x = randn(3000, seed=2, scale=0.1)  # flat: the top 1024 tokens hold well under 90%
    p = SamplingParams(top_k=0, top_p=0.9, min_p=0.0)
    ref, margin = reference_probs(x.tolist(), p, [], set())
    assert margin > 1e-9
    probs = final_probs(x, SamplerState(p, [], set()))
    assert support(probs) == set(ref) and len(ref) > 1024


@FAST
@given(
    vocab=st.integers(2, 300),
    seed=st.integers(0, 2**31),
    scale=st.sampled_from([0.3, 2.0, 8.0]),
    temperature=st.sampled_from([0.0, 0.3, 0.8, 1.0, 2.5]),
    top_k=st.sampled_from([-1, 0, 1, 3, 40, 1000]),
    top_p=st.sampled_from([0.0, 0.3, 0.9, 0.95, 1.0]),
    min_p=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    repeat_penalty=st.sampled_from([1.0, 0.8, 1.3]),
    repeat_last_n=st.sampled_from([-1, 0, 4, 64]),
    frequency_penalty=st.sampled_from([0.0, 0.5, -0.4]),
    presence_penalty=st.sampled_from([0.0, 1.0]),
    history=st.lists(st.integers(0, 9), max_size=20),
    bias=st.lists(
        st.tuples(st.integers(0, 9), st.sampled_from([-2.0, 1.5, -math.inf])), max_size=3
    ),
    ignore_eos=st.booleans(),
)
def test_final_probs_match_llama_cpp_reference(
    vocab: int, seed: int, scale: float, history: list[int], bias: list, **kw: object
) -> None:
    bias = [(t % vocab, b) for t, b in bias]
    history = [t % vocab for t in history]
    eog = {vocab - 1}
    assume(
        len({t for t, b in bias if b == -math.inf} | (eog if kw["ignore_eos"] else set())) < vocab
    )
    p = SamplingParams(logit_bias=tuple(bias), **kw)  # type: ignore[arg-type]
    p.validate(vocab)
    x = randn(vocab, seed=seed, scale=scale)
    ref, margin = reference_probs(x.tolist(), p, history, eog)
    assume(margin > 1e-5)
    probs = final_probs(x, SamplerState(p, history, eog))
    assert support(probs) == set(ref)
    for t, q in ref.items():
        assert probs[t].item() == pytest.approx(q, rel=1e-4, abs=1e-9)


def test_draws_stay_in_support_and_follow_final_probs() -> None:
    x = randn(30, seed=3, scale=1.5)
    params = dict(top_k=8, top_p=0.9, min_p=0.05, temperature=0.7)
    n = 4000
    states = [state(seed=i, **params) for i in range(n)]
    tokens = [r.token for r in sample_batch(x.expand(n, -1), states)]
    probs = final_probs(x, states[0])
    counts = Counter(tokens)
    assert set(counts) <= support(probs)
    for t in support(probs):
        sd = math.sqrt(n * probs[t].item() * (1 - probs[t].item()))
        assert abs(counts[t] - n * probs[t].item()) < 5 * sd + 1


# ---- penalties, bias, ignore_eos ----------------------------------------------------------


def test_penalty_formulas_are_llama_cpps() -> None:
    x = torch.tensor([[2.0, -1.0, 0.0, 3.0, -2.0, 1.0]])
    s = state(
        prompt=(0, 1, 2, 0, 5),
        repeat_penalty=1.5,
        frequency_penalty=0.25,
        presence_penalty=0.5,
        repeat_last_n=4,  # window (1, 2, 0, 5): the first 0 has left it
    )
    expected = torch.tensor([[2.0 / 1.5, -1.0 * 1.5, 0.0, 3.0, -2.0, 1.0 / 1.5]])
    expected -= torch.tensor([[0.75, 0.75, 0.75, 0.0, 0.0, 0.75]])
    assert torch.equal(adjusted_logits(x, [s]), expected)
    s.accept(0)  # window (2, 0, 5, 0): token 0 twice, token 1 gone
    out = adjusted_logits(x, [s])[0]
    assert out[0].item() == pytest.approx(2.0 / 1.5 - (2 * 0.25 + 0.5))
    assert out[1].item() == -1.0


@pytest.mark.parametrize(("last_n", "penalized"), [(0, set()), (2, {4, 5}), (-1, {0, 1, 2, 4, 5})])
def test_repeat_last_n_window(last_n: int, penalized: set[int]) -> None:
    x = torch.ones(1, 8)
    s = state(prompt=(0, 1, 2, 4), repeat_penalty=2.0, repeat_last_n=last_n)
    s.accept(5)
    out = adjusted_logits(x, [s])[0]
    assert {t for t in range(8) if out[t] != 1.0} == penalized


def test_logit_bias_adds_bans_and_accumulates() -> None:
    x = torch.zeros(1, 6)
    s = state(logit_bias=((1, 2.0), (1, 0.5), (2, False), (3, -math.inf), (4, -1.0)))
    assert adjusted_logits(x, [s])[0].tolist() == [0.0, 2.5, -math.inf, -math.inf, -1.0, 0.0]
    assert x.abs().sum() == 0  # the input is never modified
    n = 500
    states = [state(seed=i, logit_bias=((2, False), (3, -math.inf)), **PLAIN) for i in range(n)]
    tokens = {r.token for r in sample_batch(torch.zeros(n, 6), states)}
    assert tokens.isdisjoint({2, 3}) and len(tokens) == 4


def test_ignore_eos_never_returns_eog() -> None:
    n, vocab = 300, 10
    x = randn(n, vocab, seed=4)
    x[:, 7] = 10.0
    x[:, 9] = 9.0
    for kw in ({"temperature": 0.0}, PLAIN, {}):
        states = [state(eog=(7, 9), ignore_eos=True, seed=i, **kw) for i in range(n)]
        assert all(r.token not in (7, 9) for r in sample_batch(x, states))
    plain = [state(eog=(7, 9), seed=i) for i in range(n)]
    assert any(r.token == 7 for r in sample_batch(x, plain))
