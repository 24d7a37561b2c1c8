"""int8 x int8 matmul (oneDNN) for the largest int8 projection: Gemma's tied output.

Why not `_weight_int8pack_mm` (weight-only int8, bf16 activations) there: on this
machine's 2 threads the 262,144 x 640 output takes 16.7 ms per decode row with it and
grows linearly with rows (38 ms for 8 rows), while oneDNN's u8 x s8 kernel reads the
same int8 weights in 6.5-7.4 ms for 1-4 rows and 9.9 ms for 8 (microbenchmark, 2
threads): the output projection is most of a decode step.

Activations are quantized here, per row and in two passes: ``x * 127 / max|x|`` is
split into its rounded part and 254 x the remainder, both fed as rows of one matmul, so
the activation error is ~2^-15 of the row's range (below the int8 weights' own error;
bf16 activations are 2^-9). Every row's result depends on that row alone (integer
accumulation, per-row scales), so a token's logits do not depend on the batch.

Measured on Gemma 3 270M (final hidden states of 64 passage tokens, logits against
float64 over the same int8 weights): two passes 0.003 max / 0.0003 mean abs error;
one pass 0.77 / 0.08; the weight-only kernel with bf16 activations 0.10 / 0.010.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("loraserve.model")
# qlinear_pointwise's tail: no bias, output scale 1 and zero point 0, float32 out, no post-op
_FLOAT_OUT = (None, 1.0, 0, torch.float32, "none", [], "")


class Int8Matmul:
    """``x [M, in] float -> x W^T [M, out] float32`` for ``W = w8 * s8[:, None]``."""

    def __init__(self, w8: torch.Tensor, s8: torch.Tensor) -> None:
        self.out_features, self.in_features = w8.shape
        self.packed = torch.ops.onednn.qlinear_prepack(w8.contiguous(), [1, w8.shape[1]])
        self.scale = s8.float().contiguous()  # [out]
        self.zero = torch.zeros(w8.shape[0], dtype=torch.int32)  # symmetric weights

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        xf = x.float()
        amax = xf.abs().amax(1, keepdim=True).clamp_(min=1e-30)  # [M, 1]
        xs = xf * (127.0 / amax)  # [M, in] in [-127, 127]
        hi = torch.round(xs)
        lo = torch.round((xs - hi).mul_(254.0))  # remainder in [-0.5, 0.5] -> [-127, 127]
        q = torch.cat((hi, lo)).add_(128.0).to(torch.uint8)  # [2M, in], zero point 128
        y = torch.ops.onednn.qlinear_pointwise(
            q, 1.0, 128, self.packed, self.scale, self.zero, *_FLOAT_OUT
        )  # [2M, out]: integer dot products times the weight scales
        return torch.add(y[:m], y[m:], alpha=1.0 / 254.0).mul_(amax / 127.0)


def int8_matmul(w8: torch.Tensor, s8: torch.Tensor) -> Int8Matmul | None:
    """An `Int8Matmul` for these weights, or None where oneDNN's int8 kernel is missing
    or gives a wrong answer on this CPU (checked once against exact arithmetic)."""
    try:
        mm = Int8Matmul(w8, s8)
        if _self_check(mm, w8, s8):
            return mm
        log.warning("oneDNN int8 matmul failed its self-check; using weight-only int8")
    except (RuntimeError, AttributeError, NotImplementedError) as e:
        log.info("oneDNN int8 matmul unavailable (%s); using weight-only int8", e)
    return None


def _self_check(mm: Int8Matmul, w8: torch.Tensor, s8: torch.Tensor) -> bool:
    """Extreme and random rows against float64 on a sample of output rows: a kernel that
    saturates (u8 x s8 pairs in int16 on CPUs without VNNI) fails it."""
    k = w8.shape[1]
    g = torch.Generator().manual_seed(0)
    x = torch.cat((torch.ones(1, k), -torch.ones(1, k), torch.randn(2, k, generator=g)))
    rows = torch.arange(0, w8.shape[0], max(1, w8.shape[0] // 512))
    w = w8[rows].double() * s8[rows].double()[:, None]  # [R, in]
    ref = x.double() @ w.t()  # [4, R]
    got = mm(x)[:, rows].double()
    tol = 1e-3 * (x.double().abs() @ w.abs().t()) + 1e-6
    return bool(((got - ref).abs() <= tol).all())
