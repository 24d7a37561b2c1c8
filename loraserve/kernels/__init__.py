"""Row-independent matmul kernels on GGUF weights in their own format (C, with torch fallbacks).

`quantize_rows` turns float32 activations into int8 blocks of 32 (one fp16-rounded scale per
block, as llama.cpp's Q8_0) or, for the K-quant weights, of 256 (llama.cpp's Q8_K, whose one scale
per 256 makes a super-block's dot product one exact integer: `kquant.h`); `qmatmul`
multiplies them by quantized weight rows straight from the file's bytes, or from the same
bytes repacked once at load 8 rows to a group (`pack_rows`: Q4_0, Q5_0, Q8_0, Q4_K; a
vector's lanes are then 8 weight rows, which halves a prompt's matmul time; float weights
and LoRA deltas: `floatmm`). Each output row depends on its own input row only (the sum over
k has one fixed order, threads split output columns), so a token's numbers never depend on
its batch, its chunk or the cache state.

Why these kernels and not torch's (measured or checked here, 2 cores, torch 2.13):
``_weight_int8pack_mm`` has one scale per output row, so Q8_0's per-32 scales (and every
other format) need an extra int8 copy; ``_weight_int4pack_mm_for_cpu`` holds only 4-bit
group-affine weights, so Q5_0/Q6_K/Q8_0 (most of a Q4_K_M file) cannot be repacked into it
exactly; ``torch._int_mm`` is exact but has no per-block scales; float32 ``F.linear`` (MKL)
changes its last bits with the row count. The C kernels read each format where it lies
(memory = file size), are row-independent by construction, and at one row reach 16-18 GB/s
on Q8_0 (the DRAM bandwidth of this machine with 2 threads).

Without a C compiler the same functions run in torch: one single-row product per row over a
float32 copy of the weights made on first use (row-independent too, slower, more memory);
`backend()` says which is in use.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import NamedTuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from loraserve.cbuild import bind
from loraserve.kernels.floatmm import rowwise_torch

log = logging.getLogger("loraserve.kernels")

FLOAT_TYPES = frozenset({0, 1, 30})  # F32, F16, BF16
# Q4_0 .. Q6_K; IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4 (quant_nl.h); the IQ2/IQ3/IQ1 grid types
# (quant_iq.h)
IQ_GRID_TYPES = frozenset({16, 17, 18, 19, 21, 22, 29})
QUANT_TYPES = frozenset({2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 34, 35, 39, *IQ_GRID_TYPES})

_P = ctypes.c_void_p
_I = ctypes.c_int64
_lib: ctypes.CDLL | None = None
_loaded = False


_CI = ctypes.c_int
_SIGNATURES = {
    "ls_quantize_rows": ([_P, _I, _I, _I, _P, _P, _P, _P, _CI], None),
    "ls_quantize_rows_k": ([_P, _I, _I, _I, _P, _P, _P, _P, _CI], None),
    "ls_qmatmul": ([_CI, _P, _I, _I, _I, _P, _P, _P, _P, _I, _P, _I, _CI], _CI),
    "ls_qmatmul_multi_f32": ([_CI, _P, _P, _P, _P, _P, _I, _P, _I, _I, _P, _I, _CI], _CI),
    "ls_repack": ([_CI, _P, _I, _I, _I, _P, _CI, _CI], _CI),
    "ls_packed_group_bytes": ([_CI, _I], _I),
}


def _c() -> ctypes.CDLL | None:
    global _lib, _loaded
    if not _loaded:
        _lib = bind(_SIGNATURES)
        if _lib is None:
            log.warning("C kernels unavailable: matmuls run on the pure-torch fallback")
        _loaded = True
    return _lib


def backend() -> str:
    """'c' when the compiled kernels are in use, 'torch' for the fallback."""
    return "c" if _c() is not None else "torch"


# Q2_K .. Q6_K, IQ4_XS, TQ1_0, TQ2_0, the grid types: activations per 256 values (Q8_K)
K_QUANTS = frozenset({10, 11, 12, 13, 14, 23, 34, 35, *IQ_GRID_TYPES})
PACKED = 256  # a kernel type code `PACKED | ggml type`: rows repacked by `pack_rows`
PACKABLE = frozenset({2, 6, 8, 12})  # Q4_0, Q5_0, Q8_0, Q4_K
PACK_ROWS = 8


def pack_rows(raw: torch.Tensor, ggml_type: int, k: int) -> torch.Tensor | None:
    """ggml rows [N, row_bytes] uint8 -> the same values repacked 8 rows to a group
    (``kernels/packed.h``: a vector's lanes are 8 weight rows, the layout prompt-sized
    matmuls run fastest on), as [N, group_bytes / 8] uint8 for the kernel type
    ``PACKED | ggml_type``; None where the type, the row count or the backend has no
    packed kernel (the rows then stay as they are). ``LORASERVE_KERNEL_NO_PACK=1`` keeps
    every matrix in the file's layout (for side-by-side measurements)."""
    lib = _c()
    n = raw.shape[0]
    if os.environ.get("LORASERVE_KERNEL_NO_PACK") == "1":
        return None
    if lib is None or ggml_type not in PACKABLE or n % PACK_ROWS or n == 0:
        return None
    gb = lib.ls_packed_group_bytes(ggml_type, k)
    if gb <= 0:
        return None
    from loraserve.model.dequant import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[ggml_type]
    if k % block or raw.dim() != 2 or raw.shape[1] < k // block * size:
        raise ValueError(
            f"pack_rows: rows of {raw.shape[-1]} bytes for {k} values of type {ggml_type}"
        )
    raw = raw.contiguous()
    out = torch.empty(n, gb // PACK_ROWS, dtype=torch.uint8)
    rc = lib.ls_repack(ggml_type, raw.data_ptr(), n, k, raw.stride(0), out.data_ptr(), 1,
                       torch.get_num_threads())  # fmt: skip
    return out if rc == 0 else None


def unpack_rows(packed: torch.Tensor, ggml_type: int, k: int, row_bytes: int) -> torch.Tensor:
    """The inverse of `pack_rows`: packed [N, *] -> the file's rows [N, row_bytes] uint8."""
    lib = _c()
    if lib is None:
        raise RuntimeError("packed rows need the C kernels")
    out = torch.empty(packed.shape[0], row_bytes, dtype=torch.uint8)
    rc = lib.ls_repack(ggml_type, out.data_ptr(), packed.shape[0], k, row_bytes,
                       packed.data_ptr(), 0, torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise ValueError(f"rows of ggml type {ggml_type} are not packed ones")
    return out


def activation_block(ggml_type: int) -> int:
    """The activation block a quantized type's kernel reads: 256 for the K-quants (one
    scale per 256, integer sub-block scales: llama.cpp's Q8_K), 32 otherwise (Q8_0);
    packed types as their ggml type."""
    return 256 if (ggml_type & ~PACKED) in K_QUANTS else 32


class QuantizedRows(NamedTuple):
    """Activations quantized per row in blocks of ``block`` (32 or 256): x ≈ q * d."""

    q: torch.Tensor  # [M, K] int8
    d: torch.Tensor  # [M, K/block] float32 block scales
    ms: torch.Tensor  # [M, K/16]: block 32: float32 d * sum(q); block 256: int16 sum(q)
    x: torch.Tensor  # [M, K] the float32 input (for float-weight parts of the same input)
    block: int = 32
    bs32: torch.Tensor | None = None  # [M, K/32] int16 sum(q) over each 32


def quantize_rows(x: torch.Tensor, block: int = 32) -> QuantizedRows:
    """x: [M, K] float32, K a multiple of ``block`` (32, or 256 for K-quant weights) ->
    its `QuantizedRows`."""
    if block not in (32, 256):
        raise ValueError(f"activation blocks are 32 or 256 values, not {block}")
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] % block:
        raise ValueError(
            f"quantize_rows needs float32 [M, K*{block}], got {x.dtype} {tuple(x.shape)}"
        )
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8)
    d = torch.empty(m, k // block)
    ms = torch.empty(m, k // 16, dtype=torch.float32 if block == 32 else torch.int16)
    lib = _c()
    if lib is None:
        return _quantize_torch(x, q, d, ms, block)
    n = torch.get_num_threads()
    b32 = torch.empty(m, k // 32, dtype=torch.int16)
    if block == 32:
        lib.ls_quantize_rows(x.data_ptr(), m, k, x.stride(0), q.data_ptr(), d.data_ptr(),
                             ms.data_ptr(), b32.data_ptr(), n)  # fmt: skip
    else:
        lib.ls_quantize_rows_k(x.data_ptr(), m, k, x.stride(0), q.data_ptr(), d.data_ptr(),
                               ms.data_ptr(), b32.data_ptr(), n)  # fmt: skip
    return QuantizedRows(q, d, ms, x, block, b32)


def _quantize_torch(
    x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, ms: torch.Tensor, block: int
) -> QuantizedRows:
    m, k = x.shape
    xb = x.reshape(m, k // block, block)
    amax = xb.abs().amax(-1)  # [M, K/block]
    nz = amax != 0
    inv = torch.where(nz, 127.0 / torch.where(nz, amax, 1.0), 0.0)  # ggml's id = 127 / amax
    v = xb * inv.unsqueeze(-1)
    qi = torch.round(v).nan_to_num(0.0)  # ties to even, as C's rintf
    q.copy_(qi.reshape(m, k))
    if block == 32:  # Q8_0: an fp16 scale; Q8_K: 1 / id in float32
        dd = torch.where(nz, (amax / 127.0).half().float(), 0.0)
    else:
        dd = torch.where(nz, 1.0 / torch.where(nz, inv, 1.0), 0.0)
    bad = ~torch.isfinite(xb).all(-1)
    d.copy_(torch.where(bad, torch.full_like(dd, float("nan")), dd))
    sums = qi.reshape(m, k // 16, 16).sum(-1)  # exact small integers
    b32 = sums.reshape(m, k // 32, 2).sum(-1).to(torch.int16)
    if block == 32:
        ms.copy_(d.repeat_interleave(2, dim=1) * sums)
    else:
        ms.copy_(sums.to(torch.int16))
    return QuantizedRows(q, d, ms, x, block, b32)


def qmatmul(
    xa: QuantizedRows, raw: torch.Tensor, ggml_type: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Quantized activations [M, K] x weight rows ``raw`` [N, row_bytes] (uint8, ggml
    ``ggml_type``) -> out [M, N] float32 (``out`` may be a column slice of a wider tensor)."""
    m, k = xa.q.shape
    n = raw.shape[0]
    if xa.block != activation_block(ggml_type):
        raise ValueError(
            f"ggml type {ggml_type} reads activations in blocks of "
            f"{activation_block(ggml_type)}, got {xa.block}"
        )
    if out is None:
        out = torch.empty(m, n)
    if m == 0 or n == 0:
        return out
    lib = _c()
    if lib is None:
        if ggml_type & PACKED:
            raise ValueError("packed rows need the C kernels")
        return rowwise_torch(_dequantize_rows(xa), _float_weight(raw, ggml_type, k), out)
    if out.stride(1) != 1 or raw.stride(1) != 1:
        raise ValueError("qmatmul needs unit column strides")
    if out.shape != (m, n):
        raise ValueError(f"qmatmul: out {tuple(out.shape)} for [{m}, {n}]")
    bs32 = None if xa.bs32 is None else xa.bs32.data_ptr()
    rc = lib.ls_qmatmul(ggml_type, raw.data_ptr(), n, k, raw.stride(0), xa.q.data_ptr(),
                        xa.d.data_ptr(), xa.ms.data_ptr(), bs32, m, out.data_ptr(),
                        _ld(out), torch.get_num_threads())  # fmt: skip
    if rc == -3:
        raise ValueError(_SIZES.format(k=k, t=ggml_type, rb=raw.stride(0)))
    if rc != 0:
        raise ValueError(f"no quantized kernel for ggml type {ggml_type}")
    return out


_SIZES = (
    "quantized matmul: sizes do not fit: activations of width {k}, weight rows of type {t} "
    "and {rb} bytes (shorter than {k} values, or not whole blocks), or outputs past their rows"
)


def _ld(t: torch.Tensor) -> int:
    """A 2-D tensor's row stride as the kernels read it: a single row's stride may be any
    value in torch, so it is the row's width there."""
    return t.stride(0) if t.shape[0] > 1 else max(t.stride(0), t.shape[1])


class QuantizedParts:
    """Quantized matrices of one input side by side on the output columns (q|k|v, gate|up),
    multiplied in one kernel call (one thread fork per projection, not one per part).

    ``parts``: (rows [N_i, row_bytes] uint8, ggml type, first output column) each.
    """

    def __init__(self, parts: list[tuple[torch.Tensor, int, int]]) -> None:
        if not 1 <= len(parts) <= 8:
            raise ValueError(f"QuantizedParts takes 1 to 8 parts, got {len(parts)}")
        for raw, t, _ in parts:
            if (t & ~PACKED) not in QUANT_TYPES or (t & PACKED and _c() is None):
                raise ValueError(f"no quantized kernel for ggml type {t}")
            if raw.stride(1) != 1:
                raise ValueError("weight rows must be contiguous")
        self.parts = parts
        n = len(parts)
        self._n = n
        self._types = (ctypes.c_int * n)(*[t for _, t, _ in parts])
        self._ws = (ctypes.c_void_p * n)(*[raw.data_ptr() for raw, _, _ in parts])
        self._ns = (ctypes.c_int64 * n)(*[raw.shape[0] for raw, _, _ in parts])
        self._rb = (ctypes.c_int64 * n)(*[raw.stride(0) for raw, _, _ in parts])
        self._cols = (ctypes.c_int64 * n)(*[c for _, _, c in parts])

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """x [M, K] float32 (quantized inside the call) -> each part's columns of out [M, *]
        float32 (unit column stride)."""
        m, k = x.shape
        lib = _c()
        if lib is None or m == 0:
            xas = {b: quantize_rows(x, b) for b in {activation_block(t) for _, t, _ in self.parts}}
            for raw, t, c in self.parts:
                qmatmul(xas[activation_block(t)], raw, t, out[:, c : c + raw.shape[0]])
            return out
        if out.stride(1) != 1:
            raise ValueError("QuantizedParts needs a unit column stride for out")
        if x.dtype != torch.float32 or k % 32:
            raise ValueError(
                f"QuantizedParts needs float32 [M, K*32], got {x.dtype} {tuple(x.shape)}"
            )
        if x.stride(1) != 1:
            x = x.contiguous()
        if out.shape[0] != m:
            raise ValueError(f"QuantizedParts: out has {out.shape[0]} rows for {m}")
        rc = lib.ls_qmatmul_multi_f32(self._n, self._types, self._ws, self._ns, self._rb,
                                      self._cols, k, x.data_ptr(), _ld(x), m,
                                      out.data_ptr(), _ld(out),
                                      torch.get_num_threads())  # fmt: skip
        if rc == -3:
            raise ValueError(_SIZES.format(k=k, t=list(self._types), rb=list(self._rb)))
        if rc != 0:
            raise ValueError(f"quantized matmul failed ({rc}): a refused type or no memory")
        return out


# ---- the pure-torch fallback ------------------------------------------------------------

# the fallback's float32 copies, alive as long as the weight tensor they copy
_FLOAT_COPIES = WeakIdKeyDictionary()  # tensor -> its float32 copy


def _float_weight(raw: torch.Tensor, ggml_type: int, k: int) -> torch.Tensor:
    """A float32 copy of quantized rows, made once per tensor (fallback only)."""
    w = _FLOAT_COPIES.get(raw)
    if w is None:
        from loraserve.model.dequant import dequantize

        w = _FLOAT_COPIES[raw] = dequantize(raw.contiguous(), ggml_type, (raw.shape[0], k))
    return w


def _dequantize_rows(xa: QuantizedRows) -> torch.Tensor:
    m, k = xa.q.shape
    b = xa.block
    return (xa.q.reshape(m, k // b, b).float() * xa.d.unsqueeze(-1)).reshape(m, k)
