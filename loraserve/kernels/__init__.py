"""Row-independent matmul kernels on GGUF weights in their own format (C, with torch fallbacks).

`quantize_rows` turns float32 activations into int8 blocks of 32 (one scale per block, as
llama.cpp's Q8_0); `qmatmul` multiplies them by quantized weight rows straight from the file's
bytes; `fmatmul` multiplies float32 activations by F32/F16/BF16 rows. Each output row depends
on its own input row only (the sum over k has one fixed order, threads split output
columns), so a token's numbers never depend on its batch, its chunk or the cache state.

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
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from loraserve.kernels.build import bind

log = logging.getLogger("loraserve.kernels")

FLOAT_TYPES = frozenset({0, 1, 30})  # F32, F16, BF16
QUANT_TYPES = frozenset({2, 3, 6, 7, 8, 10, 11, 12, 13, 14})  # Q4_0 .. Q6_K
_TORCH_OF = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}

_P = ctypes.c_void_p
_I = ctypes.c_int64
_lib: ctypes.CDLL | None = None
_loaded = False


_CI = ctypes.c_int
_SIGNATURES = {
    "ls_quantize_rows": ([_P, _I, _I, _I, _P, _P, _P, _CI], None),
    "ls_qmatmul": ([_CI, _P, _I, _I, _I, _P, _P, _P, _I, _P, _I, _CI], _CI),
    "ls_qmatmul_multi": ([_CI, _P, _P, _P, _P, _P, _I, _P, _P, _P, _I, _P, _I, _CI], _CI),
    "ls_qmatmul_multi_f32": ([_CI, _P, _P, _P, _P, _P, _I, _P, _I, _I, _P, _I, _CI], _CI),
}
_FLOAT_SIGNATURES = {
    "ls_fmatmul": ([_CI, _P, _I, _I, _I, _P, _I, _I, _P, _I, _CI], _CI),
    "ls_lora": ([_CI, _P, _P, _P, _P, _P, _I, _I, _I, _P, _I, _I, _CI], _CI),
}
_flib: ctypes.CDLL | None = None
_floaded = False


def _c() -> ctypes.CDLL | None:
    global _lib, _loaded
    if not _loaded:
        _lib = bind("qmatmul", _SIGNATURES)
        if _lib is None:
            log.warning("C kernels unavailable: matmuls run on the pure-torch fallback")
        _loaded = True
    return _lib


def _cf() -> ctypes.CDLL | None:
    global _flib, _floaded
    if not _floaded:
        _flib, _floaded = bind("floatmm", _FLOAT_SIGNATURES), True
    return _flib


def lora_backend() -> str:
    """'c' when the float kernels (LoRA, float weights) are compiled, 'torch' otherwise."""
    return "c" if _cf() is not None else "torch"


def backend() -> str:
    """'c' when the compiled kernels are in use, 'torch' for the fallback."""
    return "c" if _c() is not None else "torch"


class QuantizedRows(NamedTuple):
    """Activations quantized per row in blocks of 32: x ≈ q * d (per block)."""

    q: torch.Tensor  # [M, K] int8
    d: torch.Tensor  # [M, K/32] float32 block scales
    ms: torch.Tensor  # [M, K/16] float32: d * sum(q) over each 16 values
    x: torch.Tensor  # [M, K] the float32 input (for float-weight parts of the same input)


def quantize_rows(x: torch.Tensor) -> QuantizedRows:
    """x: [M, K] float32, K a multiple of 32 -> its `QuantizedRows`."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] % 32:
        raise ValueError(f"quantize_rows needs float32 [M, K*32], got {x.dtype} {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8)
    d = torch.empty(m, k // 32)
    ms = torch.empty(m, k // 16)
    lib = _c()
    if lib is None:
        return _quantize_torch(x, q, d, ms)
    lib.ls_quantize_rows(x.data_ptr(), m, k, x.stride(0), q.data_ptr(), d.data_ptr(),
                         ms.data_ptr(), torch.get_num_threads())  # fmt: skip
    return QuantizedRows(q, d, ms, x)


def _quantize_torch(
    x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, ms: torch.Tensor
) -> QuantizedRows:
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    amax = xb.abs().amax(-1)  # [M, K/32]
    dd = amax / 127.0
    inv = torch.where(dd != 0, 1.0 / dd, torch.zeros_like(dd))
    v = xb * inv.unsqueeze(-1)
    qi = (torch.sign(v) * torch.floor(v.abs() + 0.5)).nan_to_num(0.0)  # C's roundf
    q.copy_(qi.reshape(m, k))
    bad = ~torch.isfinite(xb).all(-1)
    d.copy_(torch.where(bad, torch.full_like(dd, float("nan")), dd))
    sums = qi.reshape(m, k // 16, 16).sum(-1)  # exact small integers
    ms.copy_(d.repeat_interleave(2, dim=1) * sums)
    return QuantizedRows(q, d, ms, x)


def qmatmul(
    xa: QuantizedRows, raw: torch.Tensor, ggml_type: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Quantized activations [M, K] x weight rows ``raw`` [N, row_bytes] (uint8, ggml
    ``ggml_type``) -> out [M, N] float32 (``out`` may be a column slice of a wider tensor)."""
    m, k = xa.q.shape
    n = raw.shape[0]
    if out is None:
        out = torch.empty(m, n)
    if m == 0 or n == 0:
        return out
    lib = _c()
    if lib is None:
        return _rowwise_torch(_dequantize_rows(xa), _float_weight(raw, ggml_type, k), out)
    if out.stride(1) != 1 or raw.stride(1) != 1:
        raise ValueError("qmatmul needs unit column strides")
    rc = lib.ls_qmatmul(ggml_type, raw.data_ptr(), n, k, raw.stride(0), xa.q.data_ptr(),
                        xa.d.data_ptr(), xa.ms.data_ptr(), m, out.data_ptr(), out.stride(0),
                        torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise ValueError(f"no quantized kernel for ggml type {ggml_type}")
    return out


class QuantizedParts:
    """Quantized matrices of one input side by side on the output columns (q|k|v, gate|up),
    multiplied in one kernel call (one thread fork per projection, not one per part).

    ``parts``: (rows [N_i, row_bytes] uint8, ggml type, first output column) each.
    """

    def __init__(self, parts: list[tuple[torch.Tensor, int, int]]) -> None:
        if not 1 <= len(parts) <= 8:
            raise ValueError(f"QuantizedParts takes 1 to 8 parts, got {len(parts)}")
        for raw, t, _ in parts:
            if t not in QUANT_TYPES:
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
            xa = quantize_rows(x)
            for raw, t, c in self.parts:
                qmatmul(xa, raw, t, out[:, c : c + raw.shape[0]])
            return out
        if out.stride(1) != 1:
            raise ValueError("QuantizedParts needs a unit column stride for out")
        if x.dtype != torch.float32 or k % 32:
            raise ValueError(
                f"QuantizedParts needs float32 [M, K*32], got {x.dtype} {tuple(x.shape)}"
            )
        if x.stride(1) != 1:
            x = x.contiguous()
        rc = lib.ls_qmatmul_multi_f32(self._n, self._types, self._ws, self._ns, self._rb,
                                      self._cols, k, x.data_ptr(), x.stride(0), m,
                                      out.data_ptr(), out.stride(0),
                                      torch.get_num_threads())  # fmt: skip
        if rc != 0:
            raise ValueError(f"quantized matmul failed ({rc}): a refused type or no memory")
        return out


def fmatmul(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 x w [N, K] (float32, float16 or bfloat16) -> out [M, N] float32,
    each output row a fixed-order function of its input row."""
    if x.dtype != torch.float32:
        raise ValueError(f"fmatmul needs float32 activations, got {x.dtype}")
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"fmatmul: x has {k} columns, w has {w.shape[1]}")
    if out is None:
        out = torch.empty(m, n)
    if m == 0 or n == 0:
        return out
    lib = _cf()
    if lib is None:
        return _rowwise_torch(x, w.float(), out)
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    if out.stride(1) != 1:
        raise ValueError("fmatmul needs a unit column stride for out")
    gtype = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30}[w.dtype]
    lib.ls_fmatmul(gtype, w.data_ptr(), n, k, w.stride(0) * w.element_size(), x.data_ptr(),
                   x.stride(0), m, out.data_ptr(), out.stride(0),
                   torch.get_num_threads())  # fmt: skip
    return out


def lora_delta(
    x: torch.Tensor,
    y: torch.Tensor,
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    scales: torch.Tensor,
) -> torch.Tensor:
    """y [T, out] += each adapter's ``B (s * (A x))`` in the order of ``pairs`` (A [r, in],
    B [out, r], float32 contiguous); scales [n, T] float32, 0 where a row lacks the adapter.
    One call for all of a target's adapters, bitwise equal to the per-adapter fmatmul
    products; y may be a column slice of a wider tensor."""
    t = x.shape[0]
    lib = _cf()
    if lib is None or t == 0:
        for (a, b), s in zip(pairs, scales, strict=True):
            rows = torch.nonzero(s).squeeze(1)
            if rows.numel():
                h = fmatmul(x.index_select(0, rows), a).mul_(s[rows].unsqueeze(1))
                y.index_add_(0, rows, fmatmul(h, b))
        return y
    if x.stride(1) != 1:
        x = x.contiguous()
    if y.stride(1) != 1:
        raise ValueError("lora_delta needs a unit column stride for y")
    n = len(pairs)
    as_ = (ctypes.c_void_p * n)(*[a.data_ptr() for a, _ in pairs])
    bs_ = (ctypes.c_void_p * n)(*[b.data_ptr() for _, b in pairs])
    ranks = (ctypes.c_int64 * n)(*[a.shape[0] for a, _ in pairs])
    scales = scales.contiguous()
    rc = lib.ls_lora(n, as_, bs_, ranks, scales.data_ptr(), x.data_ptr(), x.stride(0), t,
                     x.shape[1], y.data_ptr(), y.stride(0), y.shape[1],
                     torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise MemoryError("lora_delta: out of memory")
    return y


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
    return (xa.q.reshape(m, k // 32, 32).float() * xa.d.unsqueeze(-1)).reshape(m, k)


def _rowwise_torch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    # one product per row: the same single-row call whatever the batch, so row-independent
    for i in range(x.shape[0]):
        out[i] = F.linear(x[i : i + 1], w)[0]
    return out


def float_weight_type(dtype: torch.dtype) -> int:
    """The ggml type id of a float weight dtype (F32, F16, BF16)."""
    for t, d in _TORCH_OF.items():
        if d == dtype:
            return t
    raise ValueError(f"no float kernel for weights of dtype {dtype}")
