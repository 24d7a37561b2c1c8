"""`loraserve merge` maths against dense references: concatenation is exact, ortho-SVD
is the Eckart-Young optimum, rank auto keeps the energy, linear equals PEFT's
add_weighted_adapter."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loraserve.lora.merge import Term, energy_rank, merge_target
from tests.tiny import hf_model


def _terms(shape: tuple[int, ...], ranks: list[int], coefs: list[float], seed: int) -> list[Term]:
    g = torch.Generator().manual_seed(seed)
    *lead, out, inp = shape
    return [
        Term(torch.randn(*lead, r, inp, generator=g), torch.randn(*lead, out, r, generator=g), c)
        for r, c in zip(ranks, coefs, strict=True)
    ]


def _dense(terms: list[Term]) -> torch.Tensor:
    return sum(t.coef * (t.b.double() @ t.a.double()) for t in terms)  # type: ignore[return-value]


def _optimum(delta: torch.Tensor, rank: int) -> float:
    """Eckart-Young: the least relative error of a rank-``rank`` approximation (dense SVD)."""
    s = torch.linalg.svdvals(delta.double())
    return math.sqrt(s[..., rank:].pow(2).sum().item() / s.pow(2).sum().item())


def _rel(merged_b: torch.Tensor, merged_a: torch.Tensor, delta: torch.Tensor) -> float:
    return ((merged_b.double() @ merged_a.double() - delta).norm() / delta.norm()).item()


@pytest.mark.parametrize("shape", [(24, 40), (3, 16, 12)])
def test_cat_is_exact(shape: tuple[int, ...]) -> None:
    terms = _terms(shape, [3, 5, 2], [0.7, -1.3, 0.25], seed=0)
    m = merge_target(terms, "cat")
    assert m.rank == 10 and m.rel_error < 1e-6
    assert _rel(m.b, m.a, _dense(terms)) < 1e-6


@settings(max_examples=25, deadline=None)
@given(
    out=st.integers(4, 20),
    inp=st.integers(4, 20),
    ranks=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    rank=st.integers(1, 8),
    seed=st.integers(0, 1000),
    experts=st.sampled_from([0, 2]),
)
def test_ortho_svd_is_the_eckart_young_optimum(out, inp, ranks, rank, seed, experts) -> None:
    shape = (experts, out, inp) if experts else (out, inp)
    coefs = [(-1) ** i * (0.5 + i) for i in range(len(ranks))]
    terms = _terms(shape, ranks, coefs, seed)
    delta = _dense(terms)
    m = merge_target(terms, "ortho-svd", rank=rank)
    if rank >= sum(ranks):  # full rank: the same delta as cat
        assert _rel(m.b, m.a, delta) < 1e-5 and m.rel_error < 1e-5
        cat = merge_target(terms, "cat")
        assert torch.allclose(m.b.double() @ m.a.double(), cat.b.double() @ cat.a.double(),
                              atol=1e-5 * delta.abs().max().item())  # fmt: skip
        return
    best = _optimum(delta, m.rank)
    assume(best > 1e-3)
    assert abs(_rel(m.b, m.a, delta) - best) <= 1e-5 * best
    assert abs(m.rel_error - best) <= 1e-5 * best


def test_rank_auto_keeps_the_energy() -> None:
    terms = _terms((40, 30), [6, 6], [1.0, 0.4], seed=3)
    s = torch.linalg.svdvals(_dense(terms))
    kept = (s**2).cumsum(0) / (s**2).sum()
    for energy in (0.5, 0.9, 0.99, 1.0):
        r = energy_rank(s, energy)
        assert kept[r - 1] >= energy - 1e-12 and (r == 1 or kept[r - 2] < energy)
        assert merge_target(terms, "ortho-svd", None, energy).rank == r


def test_linear_is_peft_add_weighted_adapter() -> None:
    from peft import LoraConfig, get_peft_model

    pm = get_peft_model(hf_model("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    pm.add_adapter("b", LoraConfig(r=4, lora_alpha=6, target_modules=["q_proj"]))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g))
    pm.add_weighted_adapter(["default", "b"], [0.7, -0.4], "lin", combination_type="linear")
    layer = pm.base_model.model.model.layers[0].self_attn.q_proj
    terms = [Term(layer.lora_A[n].weight, layer.lora_B[n].weight, w * layer.scaling[n])
             for n, w in (("default", 0.7), ("b", -0.4))]  # fmt: skip
    m = merge_target(terms, "linear")
    assert torch.allclose(m.a, layer.lora_A["lin"].weight, atol=1e-6)
    assert torch.allclose(m.b, layer.lora_B["lin"].weight, atol=1e-6)
    assert layer.scaling["lin"] == 1.0 and m.rel_error > 0.1  # approximate, as documented
