"""The float kernels beside the quantized matmuls: the float matmul, RMS norm, norm+rope and
the multi-adapter LoRA delta each equal their float64 formula (or the per-adapter products,
bitwise), and every output row is bitwise the same whatever else is in the batch (C kernels
and the torch fallback)."""

from __future__ import annotations

import pytest
import torch

import loraserve.kernels.floatmm as FM


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_float_kernel_is_exact_in_float64_terms_and_row_independent(dtype, backend) -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(50, 77, generator=g).to(dtype)  # 77: not a multiple of the vector width
    x = torch.randn(33, 77, generator=g)
    y = FM.fmatmul(x, w)
    ref = x.double() @ w.double().T
    assert (y.double() - ref).abs().max() < 1e-5
    alone = torch.cat([FM.fmatmul(x[i : i + 1], w) for i in range(33)])
    assert torch.equal(y, alone)
    out = torch.zeros(33, 60)
    FM.fmatmul(x, w, out[:, 5:55])  # a column slice of a wider output
    assert torch.equal(out[:, 5:55], y) and not out[:, :5].any() and not out[:, 55:].any()


def test_rms_norm_equals_float64_and_is_row_independent() -> None:
    from loraserve.kernels.rowops import rms_norm

    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 6 * 48, generator=g) * 3
    heads = x.view(40, 6, 48)[:, :5]  # a view into wider rows, as q|k heads are
    for xs, w in ((x, torch.randn(6 * 48, generator=g)), (heads, torch.randn(5, 48, generator=g))):
        xd = xs.double()
        ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        y = rms_norm(xs, w, 1e-6)
        assert (y.double() - ref).abs().max() < 1e-5 * ref.abs().max()
        assert torch.equal(torch.cat([rms_norm(xs[i : i + 1], w, 1e-6) for i in range(40)]), y)


def test_norm_rope_equals_float64_reference() -> None:
    from loraserve.kernels.rowops import norm_rope

    g = torch.Generator().manual_seed(6)
    t, h, d = 7, 5, 32
    wide = torch.randn(t, (h + 2) * d, generator=g)
    x = wide[:, : h * d].view(t, h, d)  # q|k heads inside a fused projection's rows
    pos = torch.arange(t, dtype=torch.float64)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.outer(pos, inv)  # [T, D/2]
    cos, sin = ang.cos().float(), ang.sin().float()
    for w in (None, torch.randn(h, d, generator=g)):
        xd = x.double()
        if w is not None:
            xd = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        c, s = cos.double().unsqueeze(1), sin.double().unsqueeze(1)
        a, b = xd[..., : d // 2], xd[..., d // 2 :]
        ref = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
        y = norm_rope(x, w, 1e-6, cos, sin)
        assert (y.double() - ref).abs().max() < 1e-5
        alone = torch.cat([norm_rope(x[i : i + 1], w, 1e-6, cos[i : i + 1], sin[i : i + 1])
                           for i in range(t)])  # fmt: skip
        assert torch.equal(alone, y)


def test_lora_delta_equals_per_adapter_products_bitwise(backend: str) -> None:
    """All of a target's adapters in one call: bitwise the per-adapter fmatmul products,
    added in order, rows with scale 0 untouched, into a column slice of a wider output."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 43, generator=g)  # 43: a tail past the 8-lane steps
    ranks = (4, 8, 3, 5)  # whole groups of 4 ranks, one lone rank, a group and one
    pairs = [(torch.randn(r, 43, generator=g), torch.randn(24, r, generator=g)) for r in ranks]
    scales = torch.randn(4, 6, generator=g)
    scales[0, 2] = scales[1, :3] = scales[2, 5] = scales[3, 0] = 0.0
    wide = torch.randn(6, 30, generator=g)
    want = wide.clone()
    for (a, b), s in zip(pairs, scales, strict=True):
        rows = torch.nonzero(s).squeeze(1)
        h = FM.fmatmul(x.index_select(0, rows), a).mul_(s[rows].unsqueeze(1))
        want[:, 3:27].index_add_(0, rows, FM.fmatmul(h, b))
    got = wide.clone()
    FM.lora_delta(x, got[:, 3:27], pairs, scales)
    assert torch.equal(got, want)
