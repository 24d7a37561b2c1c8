"""IQ4_NL and IQ4_XS, bit for bit as ggml's ``quantize_iq4_nl`` / ``quantize_iq4_xs`` without
an importance matrix (what ``llama-quantize`` writes then): ``quantize_row_iq4_nl_impl`` with
ntry 7 — per 32 values, the scale whose nearest kvalues_iq4nl levels fit best over 15 trial
scales (weights x^2), then (IQ4_XS) the 8 scales to 6 bits against the super-block's largest
and every level again from the stored scale.

All groups at once; each sum runs element by element in float32 in the C loop's order.
"""

from __future__ import annotations

import numpy as np

from loraserve.model.quantize_common import (
    F32,
    GROUP_MAX_EPS,
    _absmax_signed,
    _f16,
    _seqsum,
    nearest_int,
)

KV = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], F32)


def best_index(x: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8(16, kvalues_iq4nl, x) on every value: the nearer of the two
    levels around x, the upper one on ties; the ends outside them."""
    x = x.astype(F32, copy=False)
    mu = np.ones(x.shape, np.int8)  # KV[mu - 1] <= x < KV[mu] inside the ends (by compares:
    for k in range(1, 15):  # 4x faster than searchsorted on 16 levels)
        mu += x >= KV[k]
    lower = (x - KV[mu - 1]).astype(F32) < (KV[mu] - x).astype(F32)
    idx = np.where(lower, mu - 1, mu)
    return np.where(x <= KV[0], 0, np.where(x >= KV[15], 15, idx)).astype(np.uint8)


def _sums(xb: np.ndarray, w: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = KV[idx]
    wq = (w * q).astype(F32)
    return _seqsum(wq * xb), _seqsum(wq * q)


def _block_scales(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The impl's per-32 search on xb [G, 32] -> scale d [G] float32 and whether the group
    is all (near) zero [G] (its scale 0, the C loop's `continue`)."""
    w = (xb * xb).astype(F32)
    mx = _absmax_signed(xb)
    zero = np.abs(mx) < GROUP_MAX_EPS
    mxs = np.where(zero, F32(1), mx).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = ((-mxs) / F32(KV[0])).astype(F32)
        sqx, sq2 = _sums(xb, w, best_index((F32(1) / d)[:, None] * xb))
        d = np.where(sq2 > 0, sqx / sq2, F32(0)).astype(F32)
        best = (d * sqx).astype(F32)
        for itry in range(-7, 8):
            iid = (F32(itry - 127) / mxs).astype(F32)
            sqx, sq2 = _sums(xb, w, best_index(iid[:, None] * xb))
            take = (sq2 > 0) & ((sqx * sqx).astype(F32) > (best * sq2).astype(F32))
            d = np.where(take, sqx / sq2, d).astype(F32)
            best = np.where(take, d * sqx, best).astype(F32)
    return np.where(zero, F32(0), d).astype(F32), zero


def _nibbles(L: np.ndarray) -> np.ndarray:
    """levels [N, n] (n a multiple of 32) -> [N, n / 2]: byte 16 i + j = L[32 i + j] | L[32 i
    + 16 + j] << 4."""
    n = L.shape[0]
    L = L.reshape(n, -1, 2, 16)
    return (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(n, -1)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """x [N, 32] -> [N, 18] uint8 (d f16, 16 bytes of nibbles)."""
    d, _ = _block_scales(x)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    L = best_index(inv[:, None] * x)
    return np.concatenate([_f16(d)[:, None].view(np.uint8), _nibbles(L)], axis=1)


def quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    """x [N, 256] -> [N, 136] uint8 (d f16, scales_h u16, scales_l 4 bytes, 128 nibbles):
    sub-block j's scale l + 32 (0 .. 63) low nibble in scales_l[j // 2] (high for odd j), top
    two bits at 2 j of scales_h."""
    nb = x.shape[0]
    xs = x.reshape(nb * 8, 32)
    scales, _ = _block_scales(xs)
    scales = scales.reshape(nb, 8)
    max_scale = _absmax_signed(scales)
    max_scale = np.where(max_scale == 0, F32(0), max_scale).astype(F32)  # C's +0 start
    d = (-max_scale / F32(32)).astype(F32)  # -0.0 for an all-zero super-block, as in C
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
        ls = np.clip(nearest_int(inv[:, None] * scales), -32, 31)  # [nb, 8]
        dl = (d[:, None] * ls.astype(F32)).astype(F32)
        idl = np.where(dl != 0, F32(1) / dl, F32(0)).astype(F32)
    L = best_index(idl.reshape(-1)[:, None] * xs).reshape(nb, 256)
    u = (ls + 32).astype(np.uint16)
    sl = (u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)  # [nb, 4]
    sh = ((u >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)
    head = [_f16(d)[:, None].view(np.uint8), sh.astype("<u2")[:, None].view(np.uint8)]
    return np.concatenate([*head, sl.astype(np.uint8), _nibbles(L)], axis=1)
