"""The numeric helpers every ggml reference quantizer of `loraserve.model.quantize` shares:
ggml's nearest_int, a C loop's left-to-right float32 sums, fp16 rounding and the signed value
of largest magnitude, all on whole arrays of blocks at once."""

from __future__ import annotations

import numpy as np

F32 = np.float32
QK_K = 256
GROUP_MAX_EPS = F32(1e-15)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even through the float32 magic-number trick."""
    bits = (v.astype(F32) + F32(12582912.0)).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def _seqsum(a: np.ndarray) -> np.ndarray:
    """Row sums of a [N, n] float32, added left to right one by one as a C loop does
    (``np.sum`` adds pairwise): column after column over the transposed copy, each add one
    contiguous float32 vector (5x faster than ``np.add.accumulate`` along rows)."""
    at = np.ascontiguousarray(a.astype(F32, copy=False).T)  # [n, N]
    s = at[0].copy()
    for j in range(1, at.shape[0]):
        s += at[j]
    return s


def _f16(v: np.ndarray) -> np.ndarray:
    return v.astype(F32).astype(np.float16)


def _absmax_signed(x: np.ndarray) -> np.ndarray:
    """Per row of x [N, n]: the value of largest magnitude, the first one on ties (C's
    ``if (amax < fabsf(v))`` loop)."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
