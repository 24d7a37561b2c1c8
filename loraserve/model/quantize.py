"""Quantize float weights to ggml types, bit for bit as ggml's reference quantizers
(``ggml/src/ggml-quants.c``, ``quantize_row_*_ref``: what ``llama-quantize`` writes when no
importance matrix is given): Q8_0, Q5_0, Q5_1, Q4_0, Q3_K (`quantize_k3`), Q4_K, Q5_K, Q6_K,
MXFP4, IQ4_NL and IQ4_XS (`quantize_iq4`).

Every block is independent, so the work is vectorised across blocks; each reduction inside a
block runs element by element in float32, in the C loop's order, so the sums round as the C
code's do (no FMA: ggml-base is built for the baseline x86-64 target).
"""

from __future__ import annotations

import numpy as np

from loraserve.model.dequant import GGML_TYPE
from loraserve.model.quantize_common import (
    F32,
    GROUP_MAX_EPS,
    QK_K,
    _absmax_signed,
    _f16,
    _seqsum,
    nearest_int,
)
from loraserve.model.quantize_iq4 import quantize_iq4_nl, quantize_iq4_xs
from loraserve.model.quantize_k3 import quantize_q3_K


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """x [N, 32] float32 blocks -> [N, 34] uint8 (d f16, 32 int8)."""
    d = (np.abs(x).max(axis=1) / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    v = x * inv[:, None]
    a = np.abs(v)
    fl = np.floor(a)
    q = (np.sign(v) * (fl + np.floor(F32(2) * (a - fl)))).astype(np.int8)  # roundf
    return np.concatenate([_f16(d)[:, None].view(np.uint8), q.view(np.uint8)], axis=1)


def _legacy_q(x: np.ndarray, div: float, off: float, top: int) -> tuple[np.ndarray, np.ndarray]:
    mx = _absmax_signed(x)
    d = (mx / F32(div)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    q = np.trunc(x * inv[:, None] + F32(off)).astype(np.int8)  # (int8_t) cast
    return d, np.minimum(top, q.astype(np.uint8))


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """x [N, 32] -> [N, 18] uint8 (d f16, 16 bytes of nibbles)."""
    d, q = _legacy_q(x, -8.0, 8.5, 15)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([_f16(d)[:, None].view(np.uint8), qs], axis=1)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """x [N, 32] -> [N, 22] uint8 (d f16, qh u32, 16 bytes of low nibbles)."""
    d, q = _legacy_q(x, -16.0, 16.5, 31)
    qs = (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)
    hi = ((q >> 4) & 1).astype(np.uint32)  # [N, 32]: bit j is element j's fifth bit
    qh = (hi << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    return np.concatenate(
        [_f16(d)[:, None].view(np.uint8), qh.astype("<u4")[:, None].view(np.uint8), qs], axis=1
    )


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    """x [N, 32] -> [N, 24] uint8 (d f16, m f16, qh u32, 16 bytes of low nibbles)."""
    mn, mx = x.min(axis=1), x.max(axis=1)
    d = ((mx - mn) / F32(31)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    q = np.trunc((x - mn[:, None]) * inv[:, None] + F32(0.5)).astype(np.uint8)  # (uint8_t) cast
    qs = (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)
    hi = ((q >> 4) & 1).astype(np.uint32)  # [N, 32]: bit j is element j's fifth bit
    qh = (hi << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    head = np.stack([_f16(d), _f16(mn)], axis=1).view(np.uint8)  # [N, 4]
    return np.concatenate([head, qh.astype("<u4")[:, None].view(np.uint8), qs], axis=1)


_KV_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=F32)


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    """x [N, 32] -> [N, 17] uint8 (e8m0 exponent, 16 bytes of nibbles: each value's nearest
    table entry times 2^(e - 128), the first on ties, as best_index_mxfp4)."""
    amax = np.abs(x).max(axis=1)
    with np.errstate(divide="ignore"):
        lg = np.floor(np.log2(amax.astype(F32)))
    e = np.where(amax > 0, lg - 2 + 127, 0).astype(np.int64).astype(np.uint8)
    bits = np.where(e < 2, np.uint32(0x00200000) << e.astype(np.uint32),
                    (e.astype(np.uint32) - 1) << 23).astype(np.uint32)  # fmt: skip
    d = bits.view(F32)  # ggml_e8m0_to_fp32_half
    err = np.abs(_KV_MXFP4[None, None, :] * d[:, None, None] - x[:, :, None])  # [N, 32, 16]
    q = err.argmin(axis=2).astype(np.uint8)  # the first minimum, as the strict < loop
    return np.concatenate([e[:, None], q[:, :16] | (q[:, 16:] << 4)], axis=1)


def _make_qkx2(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants (use_mad false) on every row of x, w [N, n] -> L [N, n], scale [N],
    the_min [N]."""
    mn, mx = x.min(axis=1), x.max(axis=1)
    sum_w, sum_x = _seqsum(w), _seqsum(w * x)
    mn = np.where(mn > 0, F32(0), mn).astype(F32)
    flat = mx == mn
    rng = np.where(flat, F32(1), mx - mn).astype(F32)
    iscale = (F32(nmax) / rng).astype(F32)
    scale = (F32(1) / iscale).astype(F32)
    xm = (x - mn[:, None]).astype(F32)
    L = np.clip(nearest_int(iscale[:, None] * xm), 0, nmax)
    diff = scale[:, None] * L.astype(F32) + mn[:, None] - x
    best = _seqsum(w * (diff * diff))
    for s in range(nstep + 1):  # a better min found here moves the next steps' grid (as in C)
        rng = np.where(flat, F32(1), mx - mn).astype(F32)
        xm = (x - mn[:, None]).astype(F32)
        isc = ((F32(rmin) + F32(rdelta) * F32(s) + F32(nmax)) / rng).astype(F32)
        la = np.clip(nearest_int(isc[:, None] * xm), 0, nmax)
        laf = la.astype(F32)
        wl = w * laf
        sl, sl2, sxl = _seqsum(wl), _seqsum(wl * laf), _seqsum(wl * x)
        D = sum_w * sl2 - sl * sl
        ok = D > 0
        Ds = np.where(ok, D, F32(1)).astype(F32)
        this_scale = ((sum_w * sxl - sum_x * sl) / Ds).astype(F32)
        this_min = ((sl2 * sum_x - sl * sxl) / Ds).astype(F32)
        pos = this_min > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = np.where(pos, sxl / sl2, this_scale).astype(F32)
        this_min = np.where(pos, F32(0), this_min).astype(F32)
        diff = this_scale[:, None] * laf + this_min[:, None] - x
        cur = _seqsum(w * (diff * diff))
        better = ok & (cur < best) & ~flat
        L = np.where(better[:, None], la, L)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, F32(0), scale).astype(F32)
    return L.astype(np.uint8), scale, (-mn).astype(F32)


def _k_scales(x: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's common part (quantize_row_q{4,5}_K_ref) on x [N, 256]: each block's first
    16 bytes [N, 16] (d, dmin f16, 12 packed 6-bit scales and mins) and its values L [N, 8, 32]
    (0 .. nmax)."""
    nb = x.shape[0]
    sub = x.reshape(nb * 8, 32)
    sum_x2 = _seqsum(sub * sub)
    av_x = np.sqrt(sum_x2 / F32(32)).astype(F32)
    w = (av_x[:, None] + np.abs(sub)).astype(F32)
    L, scales, mins = _make_qkx2(sub, w, nmax, rmin, 0.1, nstep)
    L, scales, mins = L.reshape(nb, 256), scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    with np.errstate(divide="ignore"):
        inv_s = np.where(max_scale > 0, F32(63) / max_scale, F32(0)).astype(F32)
        inv_m = np.where(max_min > 0, F32(63) / max_min, F32(0)).astype(F32)
    ls = np.minimum(63, nearest_int(inv_s[:, None] * scales) & 0xFF).astype(np.uint8)
    lm = np.minimum(63, nearest_int(inv_m[:, None] * mins) & 0xFF).astype(np.uint8)
    sc = np.zeros((nb, 12), np.uint8)
    sc[:, 0:4] = ls[:, 0:4]
    sc[:, 4:8] = lm[:, 0:4]
    sc[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    sc[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    sc[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    d16 = _f16(max_scale / F32(63))
    dmin16 = _f16(max_min / F32(63))
    # the 6-bit scales and mins as stored (get_scale_min_k4)
    s6 = np.concatenate([sc[:, 0:4] & 63, (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)], axis=1)
    m6 = np.concatenate([sc[:, 4:8] & 63, (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)], axis=1)
    d = d16.astype(F32)[:, None] * s6.astype(F32)  # [nb, 8]
    dm = dmin16.astype(F32)[:, None] * m6.astype(F32)
    xs = x.reshape(nb, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        l2 = np.clip(nearest_int((xs + dm[:, :, None]) / d[:, :, None]), 0, nmax)
    L = np.where((d != 0)[:, :, None], l2, L.reshape(nb, 8, 32)).astype(np.uint8)
    head = np.concatenate([d16[:, None].view(np.uint8), dmin16[:, None].view(np.uint8), sc], 1)
    return head, L


def quantize_q4_K(x: np.ndarray) -> np.ndarray:
    """x [N, 256] super-blocks -> [N, 144] uint8 (d, dmin f16, 12 scale bytes, 128 nibbles)."""
    head, L = _k_scales(x, 15, -1.0, 20)
    L = L.reshape(x.shape[0], 4, 2, 32)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(x.shape[0], 128)
    return np.concatenate([head, qs], axis=1)


def quantize_q5_K(x: np.ndarray) -> np.ndarray:
    """x [N, 256] -> [N, 176] uint8 (d, dmin f16, 12 scale bytes, qh 32, 128 low nibbles):
    value 64 n + 32 h + j has its fifth bit at bit 2 n + h of qh[j]."""
    head, L = _k_scales(x, 31, -0.5, 15)
    L = L.reshape(x.shape[0], 4, 2, 32)
    qs = ((L[:, :, 0] & 15) | ((L[:, :, 1] & 15) << 4)).reshape(x.shape[0], 128)
    shift = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)  # [4, 2]
    qh = ((L >> 4) << shift[None, :, :, None]).sum(axis=(1, 2), dtype=np.uint8)  # [N, 32]
    return np.concatenate([head, qh, qs], axis=1)


def _make_qx_rmse1(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(n, nmax, x, L, rmse_type=1, NULL) on every row of x [N, n] -> L [N, n]
    (0 .. 2 nmax - 1), scale [N]."""
    mx = _absmax_signed(x)
    zero = np.abs(mx) < GROUP_MAX_EPS
    mxs = np.where(zero, F32(1), mx).astype(F32)

    def sums(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lq = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        lf = lq.astype(F32)
        wv = x * x
        return lq + nmax, _seqsum(wv * x * lf), _seqsum(wv * lf * lf)

    L, sumlx, suml2 = sums((F32(-nmax) / mxs).astype(F32))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
    best = scale * sumlx
    for s in range(-9, 10):
        if s == 0:
            continue
        isc = (-(F32(nmax) + F32(0.1) * F32(s)) / mxs).astype(F32)
        lq, sumlx, suml2 = sums(isc)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(better[:, None], lq, L)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(better, sumlx / suml2, scale).astype(F32)
        best = np.where(better, scale * sumlx, best).astype(F32)
    L = np.where(zero[:, None], 0, L)
    return L, np.where(zero, F32(0), scale).astype(F32)


def quantize_q6_K(x: np.ndarray) -> np.ndarray:
    """x [N, 256] super-blocks -> [N, 210] uint8 (128 ql, 64 qh, 16 int8 scales, d f16)."""
    nb = x.shape[0]
    L, scales = _make_qx_rmse1(x.reshape(nb * 16, 16), 32)
    L, scales = L.reshape(nb, 16, 16), scales.reshape(nb, 16)
    max_scale = _absmax_signed(scales)
    empty = np.abs(max_scale) < GROUP_MAX_EPS
    ms = np.where(empty, F32(1), max_scale).astype(F32)
    iscale = (F32(-128) / ms).astype(F32)
    d16 = _f16(F32(1) / iscale)
    sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
    d = d16.astype(F32)[:, None] * sc.astype(F32)  # [nb, 16]
    xs = x.reshape(nb, 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        l2 = np.clip(nearest_int(xs / d[:, :, None]), -32, 31) + 32
    L = np.where((d != 0)[:, :, None], l2, L).astype(np.uint8).reshape(nb, 2, 4, 32)
    ql = np.concatenate(
        [
            L[:, :, 0] & 0xF | ((L[:, :, 2] & 0xF) << 4),
            L[:, :, 1] & 0xF | ((L[:, :, 3] & 0xF) << 4),
        ],
        axis=2,
    ).reshape(nb, 128)
    qh = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4)
          | ((L[:, :, 3] >> 4) << 6)).reshape(nb, 64)  # fmt: skip
    out = np.concatenate([ql, qh, sc.view(np.uint8), d16[:, None].view(np.uint8)], axis=1)
    out[empty] = 0
    return out


_BLOCK = {"Q8_0": (32, quantize_q8_0), "Q5_0": (32, quantize_q5_0), "Q5_1": (32, quantize_q5_1),
          "Q4_0": (32, quantize_q4_0), "Q3_K": (QK_K, quantize_q3_K),
          "Q4_K": (QK_K, quantize_q4_K),
          "Q5_K": (QK_K, quantize_q5_K),
          "Q6_K": (QK_K, quantize_q6_K), "MXFP4": (32, quantize_mxfp4),
          "IQ4_NL": (32, quantize_iq4_nl), "IQ4_XS": (QK_K, quantize_iq4_xs)}  # fmt: skip
QUANTIZERS: dict[int, tuple[int, object]] = {GGML_TYPE[k]: v for k, v in _BLOCK.items()}


def quantize(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """float weights [..., n_per_row] -> ggml rows [prod(...), row_bytes] uint8 of
    ``ggml_type`` (Q8_0, Q5_0, Q5_1, Q4_0, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, IQ4_NL, IQ4_XS), as
    ggml's quantizers write them without an importance matrix."""
    if ggml_type not in QUANTIZERS:
        raise ValueError(f"no quantizer for ggml type {ggml_type}")
    qk, fn = QUANTIZERS[ggml_type]
    a = np.ascontiguousarray(x, dtype=F32)
    if a.shape[-1] % qk:
        raise ValueError(f"rows of {a.shape[-1]} are not whole blocks of {qk}")
    rows = a.reshape(-1, a.shape[-1])
    blocks = fn(rows.reshape(-1, qk))  # type: ignore[operator]
    return blocks.reshape(rows.shape[0], -1)
