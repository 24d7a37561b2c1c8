"""Q3_K, bit for bit as ggml's ``quantize_row_q3_K_ref`` (what ``llama-quantize`` writes for
Q3_K without an importance matrix): each 16 values' 3-bit levels and scale by
``make_q3_quants`` (rmse refinement on), the 16 scales to 6 bits against the block's largest,
then every level again from the stored scale.

The refinement visits a group's values one by one, each change moving the group's running
sums, so it runs here over all groups at once, value by value, in the C loop's float32
order. A group whose pass changes nothing stops in C; here it goes on, changing nothing
again (its state is what the pass read), so the result is the same.
"""

from __future__ import annotations

import numpy as np

from loraserve.model.quantize_common import F32, GROUP_MAX_EPS, _absmax_signed, _f16, nearest_int


def _make_q3(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_q3_quants(n, nmax, x, L, do_rmse=true) on every row of x [G, n] -> L [G, n]
    (0 .. 2 nmax - 1) and scale [G]."""
    mx = _absmax_signed(x)
    zero = np.abs(mx) < GROUP_MAX_EPS
    mxs = np.where(zero, F32(1), mx).astype(F32)
    iscale = (F32(-nmax) / mxs).astype(F32)
    L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1).astype(np.int64)  # [G, n]
    w = (x * x).astype(F32)
    wx = (w * x).astype(F32)
    sumlx = np.zeros(x.shape[0], F32)
    suml2 = np.zeros(x.shape[0], F32)
    for i in range(x.shape[1]):  # the C loop's order: sums grow value by value
        li = L[:, i].astype(F32)
        sumlx = (sumlx + wx[:, i] * li).astype(F32)
        suml2 = (suml2 + (w[:, i] * li) * li).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(5):
            for i in range(x.shape[1]):
                li = L[:, i].astype(F32)
                slx = (sumlx - wx[:, i] * li).astype(F32)
                pos = slx > 0
                sl2 = (suml2 - (w[:, i] * li) * li).astype(F32)
                q = (x[:, i] * sl2).astype(F32) / np.where(pos, slx, F32(1))
                new_l = np.clip(nearest_int(np.where(pos, q, F32(0))), -nmax, nmax - 1)
                nf = new_l.astype(F32)
                slx2 = (slx + wx[:, i] * nf).astype(F32)
                sl22 = (sl2 + (w[:, i] * nf) * nf).astype(F32)
                take = (
                    pos
                    & (new_l != L[:, i])
                    & (sl22 > 0)
                    & ((slx2 * slx2) * suml2 > (sumlx * sumlx) * sl22)
                )
                L[:, i] = np.where(take, new_l, L[:, i])
                sumlx = np.where(take, slx2, sumlx).astype(F32)
                suml2 = np.where(take, sl22, suml2).astype(F32)
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    L = np.where(zero[:, None], 0, L + nmax)
    return L, np.where(zero, F32(0), scale).astype(F32)


def quantize_q3_K(x: np.ndarray) -> np.ndarray:
    """x [N, 256] super-blocks -> [N, 110] uint8 (hmask 32, qs 64, 12 scale bytes, d f16):
    value j's third bit at bit j // 32 of hmask[j % 32]; its low two bits at bits
    2 ((j % 128) // 32) of qs[32 (j // 128) + j % 32]; scale j (6 bits, stored + 32) low
    nibble in byte j % 8 (high nibble for j >= 8), top two bits at 2 (j // 4) of byte 8 + j % 4."""
    nb = x.shape[0]
    L, scales = _make_q3(x.reshape(nb * 16, 16), 4)
    L, scales = L.reshape(nb, 16, 16), scales.reshape(nb, 16)
    max_scale = _absmax_signed(scales)
    has = max_scale != 0
    ms = np.where(has, max_scale, F32(1)).astype(F32)
    iscale = (F32(-32) / ms).astype(F32)
    ls = (np.clip(nearest_int(iscale[:, None] * scales), -32, 31) + 32).astype(np.uint8)
    ls = np.where(has[:, None], ls, 0).astype(np.uint8)  # [nb, 16], 0 .. 63
    sc = np.zeros((nb, 12), np.uint8)
    sc[:, 0:8] = (ls[:, 0:8] & 0xF) | ((ls[:, 8:16] & 0xF) << 4)
    hi = (ls >> 4).reshape(nb, 4, 4)  # [nb, j // 4, j % 4]
    sc[:, 8:12] = (hi << (2 * np.arange(4, dtype=np.uint8))[None, :, None]).sum(
        axis=1, dtype=np.uint8
    )
    d16 = np.where(has, _f16(F32(1) / iscale), np.float16(0))
    # the scales as stored, read back (sc - 32); a zero one keeps make_q3_quants' levels
    d = d16.astype(F32)[:, None] * (ls.astype(np.int64) - 32).astype(F32)  # [nb, 16]
    xs = x.reshape(nb, 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        l2 = np.clip(nearest_int(xs / np.where(d != 0, d, F32(1))[:, :, None]), -4, 3) + 4
    L = np.where((d != 0)[:, :, None], l2, L).reshape(nb, 256).astype(np.uint8)
    hbit = (L > 3).reshape(nb, 8, 32).astype(np.uint8)  # [nb, j // 32, j % 32]
    hmask = (hbit << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    low = (L & 3).reshape(nb, 2, 4, 32)  # [nb, j // 128, (j % 128) // 32, j % 32]
    qs = (low << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(
        axis=2, dtype=np.uint8
    )
    return np.concatenate([hmask, qs.reshape(nb, 64), sc, d16[:, None].view(np.uint8)], axis=1)
