"""Matmul tasks taken by threads from a shared counter (`qmatmul_multi`'s dynamic runs,
`moe_plan.h`'s st_matmul): every output row has the same bits whichever thread ran its task,
so 1, 2 and 3 threads give the same results, dense and grouped alike, at a decode row and
at a prompt's rows (runs of several tasks, several runs a thread)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import loraserve.kernels as K
from loraserve.kernels.moe import GroupedExperts
from loraserve.model.dequant import GGML_TYPE
from loraserve.model.projection import Matrix, Projection
from tests.unit.model.quant_util import random_rows

pytestmark = pytest.mark.skipif(K.backend() != "c", reason="needs the C kernels")


def at_threads(fn, n: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("rows", [1, 3, 40])
def test_dense_projection_same_bits_at_any_thread_count(rows: int) -> None:
    rng = np.random.default_rng(rows)
    parts = []
    for name, n in (("Q4_K", 1024), ("Q6_K", 512), ("Q8_0", 256)):
        raw = torch.from_numpy(random_rows(rng, name, n, 512))
        parts.append(Matrix(f"p.{name}", raw, GGML_TYPE[name], (n, 512)).pack())
    proj = Projection("p", parts)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    one = at_threads(lambda: proj.base(x), 1)
    for n in (2, 3):
        assert torch.equal(at_threads(lambda: proj.base(x), n), one)


@pytest.mark.parametrize("tokens", [1, 37])
def test_grouped_experts_same_bits_at_any_thread_count(tokens: int) -> None:
    rng = np.random.default_rng(tokens)
    e, h, f, k = 8, 256, 512, 3

    def stack(name: str, n: int, kk: int) -> tuple[list[torch.Tensor], int]:
        t = GGML_TYPE[name]
        raws = [torch.from_numpy(random_rows(rng, name, n, kk)) for _ in range(e)]
        packed = [K.pack_rows(r, t, kk) for r in raws]
        return ([p for p in packed if p is not None], t | K.PACKED) if packed[0] is not None \
            else (raws, t)  # fmt: skip

    g = GroupedExperts([stack("Q4_K", f, h), stack("Q4_K", f, h)], stack("Q6_K", h, f), "silu")
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, h, generator=gen)
    experts = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, generator=gen)
    one = at_threads(lambda: g.ffn_rows(x, experts, w), 1)
    for n in (2, 3):
        assert torch.equal(at_threads(lambda: g.ffn_rows(x, experts, w), n), one)
