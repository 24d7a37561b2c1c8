"""Latent attention's per-head matrices (`attn.heads.HeadStack`: deepseek2's attn_k_b / attn_v_b
as one grouped call) give each head's rows the bits of that head's matrix alone through the
plain quantized kernel (`kernels.qmatmul` on the rows the stack holds: packed 8 rows to a group
where the type has packed tiles, else the file's), for any number of tokens and a strided
input, and agree with a float64 product of the dequantized weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import loraserve.kernels as K
from loraserve.model.attn.heads import HeadStack, head_loop
from loraserve.model.dequant import GGML_TYPE
from loraserve.model.projection import Matrix
from tests.unit.model.quant_util import dequantized, random_rows

pytestmark = pytest.mark.skipif(K.backend() != "c", reason="grouped heads need the C kernels")

# (type, out, in): V2-Lite's attn_k_b is Q5_0 [512, 128], attn_v_b Q4_K [128, 512]
CASES = [("Q5_0", 64, 128), ("Q4_K", 32, 256), ("Q8_0", 48, 64), ("Q6_K", 16, 512)]


def _stack(name: str, n_heads: int, n: int, k: int, seed: int) -> tuple[list[Matrix], list]:
    rng = np.random.default_rng(seed)
    raws = [random_rows(rng, name, n, k) for _ in range(n_heads)]
    t = GGML_TYPE[name]
    mats = [Matrix.from_raw("blk.0.attn_k_b.weight", torch.from_numpy(r), t, (n, k)) for r in raws]
    return mats, raws


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "file_rows"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("t", [1, 3, 17])
def test_grouped_heads_equal_each_head_alone_bitwise(
    case: tuple, t: int, packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, n, k = case
    if not packed:
        monkeypatch.setenv("LORASERVE_KERNEL_NO_PACK", "1")
    h, extra = 4, 32  # each head's input row is wider than the matrix reads (q's rope part)
    mats, raws = _stack(name, h, n, k, seed=t)
    stack = HeadStack(mats)
    assert stack.proj is not None  # the grouped path, not the loop
    assert all(m.packed == packed for m in stack.mats)  # every CASES type has packed tiles
    x = torch.randn(t, h, k + extra, generator=torch.Generator().manual_seed(t))
    got = stack(x, None)  # [T, H, n]
    assert got.shape == (t, h, n)
    typ = GGML_TYPE[name]
    for j, m in enumerate(stack.mats):
        assert torch.equal(m.file_rows(), torch.from_numpy(raws[j]))  # the same values
        xa = K.quantize_rows(x[:, j, :k].contiguous(), K.activation_block(typ))
        want = K.qmatmul(xa, m.data, m.kernel_type)  # [T, n]
        assert torch.equal(got[:, j], want), (name, t, j)
    assert torch.equal(head_loop(stack.mats, x[:, :, :k], None), got)
    # a row's bits do not depend on the other tokens of the step
    assert torch.equal(stack(x[t - 1 :].contiguous(), None)[0], got[t - 1])


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c[0])
def test_grouped_heads_near_float64_reference(case: tuple) -> None:
    name, n, k = case
    h, t = 3, 5
    mats, raws = _stack(name, h, n, k, seed=7)
    x = torch.randn(t, h, k, generator=torch.Generator().manual_seed(3))
    got = HeadStack(mats)(x, None).double().numpy()  # [T, H, n]
    for j in range(h):
        want = x[:, j].double().numpy() @ dequantized(raws[j], name, n, k).T  # [T, n]
        scale = np.abs(want).max()
        assert np.abs(got[:, j] - want).max() < 0.02 * scale, (name, j)
