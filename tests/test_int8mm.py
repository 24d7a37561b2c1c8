"""The oneDNN int8 x int8 output projection: accuracy, batch invariance, fallback."""

from __future__ import annotations

import pytest
import torch

from loraserve.model import int8mm
from loraserve.model.int8mm import Int8Matmul, int8_matmul
from loraserve.model.layers import Linear, quantize_int8

needs_onednn = pytest.mark.skipif(
    int8_matmul(*quantize_int8(torch.randn(8, 64))) is None,
    reason="oneDNN int8 kernel not available on this CPU",
)


def _weights(out: int = 512, k: int = 640, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, k, generator=g) * 0.05
    w8, s8 = quantize_int8(w)
    exact = w8.double() * s8.double()[:, None]  # the int8 weights' own values [out, k]
    return w8, s8, exact


def _inputs(m: int, k: int = 640, seed: int = 1) -> torch.Tensor:
    """Rows of very different magnitudes, some with outlier channels (as hidden states)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m)[:, None]
    x[:, 7] *= 40.0
    return x


@needs_onednn
def test_more_accurate_than_weight_only_int8_with_bf16_activations() -> None:
    """Both read the same int8 weights; the two-pass activation quantization must lose
    less than bf16 activations do (the path it replaces), measured against float64."""
    w8, s8, exact = _weights()
    x = _inputs(9)
    ref = x.double() @ exact.t()  # [9, out]
    ours = Int8Matmul(w8, s8)(x).double()
    weight_only = torch.ops.aten._weight_int8pack_mm(x.bfloat16(), w8, s8).double()
    scale = ref.abs().amax(1, keepdim=True)
    err_ours = ((ours - ref).abs() / scale).max().item()
    err_wo = ((weight_only - ref).abs() / scale).max().item()
    assert err_ours < err_wo, (err_ours, err_wo)
    assert err_ours < 1e-3


@needs_onednn
def test_each_row_is_independent_of_the_batch() -> None:
    """A row's output is bit-identical alone, in any batch, in any position."""
    w8, s8, _ = _weights(out=300)
    mm = Int8Matmul(w8, s8)
    x = _inputs(7)
    together = mm(x)
    perm = torch.tensor([6, 0, 3, 1, 5, 2, 4])
    shuffled = mm(x[perm])
    for i in range(7):
        alone = mm(x[i : i + 1])
        assert torch.equal(alone[0], together[i])
        assert torch.equal(shuffled[(perm == i).nonzero().item()], together[i])


@needs_onednn
def test_zero_row_gives_zeros() -> None:
    w8, s8, _ = _weights(out=64, k=64)
    y = Int8Matmul(w8, s8)(torch.zeros(2, 64))
    assert torch.equal(y, torch.zeros(2, 64))


def test_self_check_rejects_a_saturating_kernel(monkeypatch) -> None:
    """A kernel that saturates (as u8 x s8 pair sums in int16 do without VNNI) must be
    refused, and the caller falls back to weight-only int8."""
    w8, s8, exact = _weights(out=256, k=64)
    w8[:, :] = 127  # every pair sum 255 * 127 * 2 would overflow int16

    class Saturating:
        def __init__(self, w8: torch.Tensor, s8: torch.Tensor) -> None:
            self.w = w8.float() * s8.float()[:, None]

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return (x @ self.w.t()).clamp(-1.0, 1.0)

    monkeypatch.setattr(int8mm, "Int8Matmul", Saturating)
    assert int8_matmul(w8, s8) is None


def test_linear_falls_back_when_the_kernel_is_missing(monkeypatch) -> None:
    def missing(*_: object) -> None:
        raise RuntimeError("no onednn here")

    monkeypatch.setattr(int8mm.Int8Matmul, "__init__", missing)
    w = torch.randn(32, 64) * 0.1
    lin = Linear("output.weight", w, None, torch.float32, int8=True, keep_float=False)
    assert lin.use_int8_matmul() is False
    x = torch.randn(3, 64)
    want = x @ (lin.w8.float() * lin.s8.float()[:, None]).t()
    torch.testing.assert_close(lin.base(x), want, rtol=2e-2, atol=2e-2)
