"""The sampler per request: seeds independent of the batch, n_probs, parameter validation,
and the logits forms the engine hands over (bf16, non-contiguous, a large vocabulary)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from loraserve.engine.sampling.chain import sample_batch
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.sampling.state import SamplerState
from tests.unit.sampling.sampling_util import FAST, PLAIN, final_probs, randn, state

# ---- seeds ----------------------------------------------------------------------------------


def _run(target: SamplingParams, logits: list[torch.Tensor], batches: list) -> list[int]:
    """Sample `target` for len(logits) steps, step i inside batches[i] = (the target's row,
    the other rows' params), accepting every token; returns the target's tokens."""
    vocab = logits[0].shape[0]
    me = SamplerState(target, [1 % vocab, 2 % vocab], {0})
    out = []
    for step, (row, (pos, other_params)) in enumerate(zip(logits, batches, strict=True)):
        states = [SamplerState(p, [step % vocab], {0}) for p in other_params]
        states.insert(pos, me)
        x = randn(len(states), vocab, seed=1000 + step, scale=2.0)
        x[pos] = row
        res = sample_batch(x, states)
        for s, r in zip(states, res, strict=True):
            s.accept(r.token)
        out.append(res[pos].token)
    return out


params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.5]),
    top_k=st.sampled_from([0, 1, 5, 40, 100]),
    top_p=st.sampled_from([0.5, 0.95, 1.0]),
    min_p=st.sampled_from([0.0, 0.05]),
    repeat_penalty=st.sampled_from([1.0, 1.2]),
    presence_penalty=st.sampled_from([0.0, 0.5]),
    n_probs=st.sampled_from([0, 3]),
    post_sampling_probs=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)


@FAST
@given(
    target=params_strategy,
    vocab=st.integers(2, 600),
    seed=st.integers(0, 2**31),
    batches=st.lists(
        st.tuples(st.integers(0, 4), st.lists(params_strategy, max_size=4)), min_size=4, max_size=4
    ),
)
def test_seeded_request_ignores_batch_composition(
    target: SamplingParams, vocab: int, seed: int, batches: list
) -> None:
    logits = [randn(vocab, seed=seed + i, scale=2.0) for i in range(len(batches))]
    batches = [(min(pos, len(others)), others) for pos, others in batches]
    alone = _run(target, logits, [(0, [])] * len(batches))
    assert _run(target, logits, batches) == alone


def test_seeds_matter_and_minus_one_is_random() -> None:
    x = randn(64, 1000, seed=5, scale=0.2)
    a = [r.token for r in sample_batch(x, [state(seed=1, **PLAIN) for _ in range(64)])]
    b = [r.token for r in sample_batch(x, [state(seed=2, **PLAIN) for _ in range(64)])]
    assert a != b
    assert state(seed=-1).seed != state(seed=-1).seed


# ---- n_probs ----------------------------------------------------------------------------------


def test_n_probs_default_is_softmax_of_raw_logits() -> None:
    x = randn(2, 50, seed=6)
    s = state(n_probs=5, logit_bias=((int(x[0].argmax()), False),), temperature=0.5)
    res = sample_batch(x[:1], [s])[0]
    raw = torch.softmax(x[0], 0)
    assert [t for t, _ in res.probs] == torch.topk(raw, 5).indices.tolist()
    assert [p for _, p in res.probs] == pytest.approx(torch.topk(raw, 5).values.tolist())
    assert res.prob == pytest.approx(raw[res.token].item())
    assert sum(p for _, p in res.probs) <= 1.0


@pytest.mark.parametrize("kw", [{"top_k": 3}, {"top_k": 0, "top_p": 1.0, "min_p": 0.0}, {}])
def test_n_probs_post_sampling_is_the_drawn_distribution(kw: dict) -> None:
    x = randn(40, seed=7, scale=2.0)
    s = state(n_probs=5, post_sampling_probs=True, seed=3, **kw)
    res = sample_batch(x[None], [s])[0]
    probs = final_probs(x, s)
    expected = [(t, probs[t].item()) for t in torch.topk(probs, 5).indices.tolist()]
    expected = [(t, p) for t, p in expected if p > 0]
    assert [t for t, _ in res.probs] == [t for t, _ in expected]
    assert [p for _, p in res.probs] == pytest.approx([p for _, p in expected])
    assert [p for _, p in res.probs] == sorted((p for _, p in res.probs), reverse=True)
    assert sum(p for _, p in res.probs) <= 1.0 + 1e-9
    assert res.prob == pytest.approx(probs[res.token].item())


def test_n_probs_greedy_and_mixed_batch() -> None:
    x = randn(3, 100, seed=8)
    states = [
        state(temperature=0, n_probs=4, post_sampling_probs=True),
        state(temperature=0, n_probs=4),
        state(temperature=0),
    ]
    a, b, c = sample_batch(x, states)
    assert a.probs == [(a.token, 1.0)] and a.prob == 1.0
    assert len(b.probs) == 4 and b.probs[0][0] == b.token == int(x[1].argmax())
    assert c.probs is None and c.token == int(x[2].argmax())


# ---- validation and inputs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.1}, "top_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_k": 2.5}, "top_k"),
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"repeat_penalty": -1.0}, "repeat_penalty"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"presence_penalty": math.inf}, "presence_penalty"),
        ({"frequency_penalty": math.nan}, "frequency_penalty"),
        ({"seed": -2}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"n_probs": -1}, "n_probs"),
        ({"logit_bias": ((100, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((1, math.nan),)}, "logit_bias"),
        ({"logit_bias": ((1, math.inf),)}, "logit_bias"),
        ({"logit_bias": ((1, True),)}, "logit_bias"),
        ({"logit_bias": tuple((t, False) for t in range(100))}, "logit_bias"),
        ({"ignore_eos": 1}, "ignore_eos"),
    ],
)
def test_invalid_params_name_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}"):
        SamplingParams(**kw).validate(100)


def test_defaults_are_llama_servers_and_valid() -> None:
    p = SamplingParams()
    p.validate(10)
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_penalty, p.repeat_last_n, p.seed, p.n_probs) == (1.0, 64, -1, 0)
    SamplingParams(top_k=-1, temperature=-1.0, logit_bias=((3, False),)).validate(10)


def test_bf16_non_contiguous_and_large_vocab_logits() -> None:
    big = randn(2, 262_144, seed=9, scale=3.0)
    res = sample_batch(big, [state(seed=1), state(seed=2, n_probs=2)])
    for row, r in zip(big, res, strict=True):
        assert r.token in torch.topk(row, 40).indices.tolist()
    x = randn(100, 4, seed=10).to(torch.bfloat16).t()  # [4, 100], non-contiguous
    states = [state(temperature=0), state(seed=3), state(top_k=0, seed=4), state(top_k=0)]
    out = sample_batch(x, states)
    assert out[0].token == int(x[0].float().argmax())
    with pytest.raises(ValueError):
        sample_batch(x, states[:2])
