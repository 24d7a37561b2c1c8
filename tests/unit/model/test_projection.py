"""Projections: a fused projection (q|k|v, gate|up) with parts of different stored types
equals its parts run one by one, bitwise, with or without LoRA deltas on some parts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loraserve.model.context import AttnMeta, StepContext, set_context
from loraserve.model.dequant import GGML_TYPE
from loraserve.model.projection import Matrix, Projection
from tests.unit.model.quant_util import random_rows


class _Delta:
    """A LoraDelta adding a fixed per-target matrix; returns a new tensor for 'k' (as a
    delta implementation may) and adds in place for the others."""

    def __init__(self, deltas: dict[str, torch.Tensor]) -> None:
        self.deltas = deltas

    def apply(self, target: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        d = self.deltas.get(target)
        if d is None:
            return y
        if "attn_k" in target:
            return y + x @ d.t()
        return y.add_(x @ d.t())

    def apply_expert(self, *args: object) -> torch.Tensor:  # pragma: no cover - unused
        raise AssertionError


def _ctx(t: int, lora: _Delta | None) -> StepContext:
    z = torch.zeros(t, dtype=torch.int32)
    attn = AttnMeta(torch.zeros(1, dtype=torch.long), torch.tensor([0, 1]), z, z + 1)
    return StepContext(torch.zeros(t, dtype=torch.long), attn, torch.arange(t), lora=lora)


@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("types", [("Q5_0", "Q8_0", "Q6_K"), ("F32", "Q4_K", "BF16")])
def test_fused_equals_parts(with_lora: bool, types: tuple[str, str, str]) -> None:
    rng = np.random.default_rng(0)
    g = torch.Generator().manual_seed(0)
    k = 256
    names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]
    sizes = [16, 8, 8]
    mats = []
    for name, n, t in zip(names, sizes, types, strict=True):
        if t == "F32":
            mats.append(Matrix.from_float(name, torch.randn(n, k, generator=g)))
        elif t == "BF16":
            mats.append(Matrix.from_float(name, torch.randn(n, k, generator=g).bfloat16()))
        else:
            raw = torch.from_numpy(random_rows(rng, t, n, k))
            mats.append(Matrix.from_raw(name, raw, GGML_TYPE[t], (n, k)))
    bias = torch.randn(32, generator=g)
    parts = [Projection(m.name, [m], bias[lo : lo + m.shape[0]])
             for m, lo in zip(mats, (0, 16, 24), strict=True)]  # fmt: skip
    fused = Projection("blk.0.attn_qkv.weight", mats, bias)
    lora = None
    if with_lora:
        lora = _Delta(
            {names[0]: torch.randn(16, k, generator=g), names[1]: torch.randn(8, k, generator=g)}
        )
    x = torch.randn(5, k, generator=g)
    set_context(_ctx(5, lora))
    try:
        want = torch.cat([p(x) for p in parts], dim=1)
        got = fused(x)
    finally:
        set_context(None)
    assert torch.equal(got, want)
    assert [s[0] for s in fused.spans] == names  # each part is its own LoRA target


def test_parts_must_share_the_input_size() -> None:
    a = Matrix.from_float("a", torch.randn(4, 3))
    b = Matrix.from_float("b", torch.randn(4, 5))
    with pytest.raises(ValueError, match="disagree on the input size"):
        Projection("f", [a, b])
