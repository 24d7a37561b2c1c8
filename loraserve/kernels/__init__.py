"""Row-independent matmul kernels on GGUF weights in their own format (C, with torch fallbacks).

`quantize_rows` (`activations.py`) turns float32 activations into int8 blocks of 32 (one
fp16-rounded scale per block, as llama.cpp's Q8_0) or, for the K-quant weights, of 256
(llama.cpp's Q8_K, whose one scale per 256 makes a super-block's dot product one exact integer:
`kquant.h`); `qmatmul` multiplies them by quantized weight rows straight from the file's bytes,
or from the same bytes repacked once at load 8 rows to a group (`pack_rows`, `pack.py`: Q4_0,
Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, IQ4_NL, IQ4_XS; a vector's lanes are then 8 weight rows, which
halves a prompt's matmul time, and AVX-512 builds take two groups in one 512-bit vector:
`packed_z.h`, `packed_zk.h`; several matrices of one input: `QuantizedParts`, `parts.py`;
float weights and LoRA deltas: `floatmm`). Each output row depends on its own input row only (the
sum over k has one fixed order, threads split output columns), so a token's numbers never
depend on its batch, its chunk or the cache state.

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

import torch
from torch.utils.weak import WeakIdKeyDictionary

from loraserve.cbuild import bind
from loraserve.kernels.activations import QuantizedRows, quantize_rows
from loraserve.kernels.floatmm import rowwise_torch
from loraserve.kernels.pack import PACK_ROWS, PACKABLE, pack_rows, unpack_rows
from loraserve.kernels.parts import QuantizedParts

__all__ = [
    "FLOAT_TYPES", "IQ_GRID_TYPES", "K_QUANTS", "PACK_ROWS", "PACKABLE", "PACKED", "QUANT_TYPES",
    "QuantizedParts", "QuantizedRows", "activation_block", "backend", "pack_rows", "qmatmul",
    "quantize_rows", "unpack_rows",
]  # fmt: skip
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
    "ls_quantize_rows": ([_P, _I, _I, _I, _P, _P, _P, _P, _CI], _CI),
    "ls_quantize_rows_k": ([_P, _I, _I, _I, _P, _P, _P, _P, _CI], _CI),
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


def activation_block(ggml_type: int) -> int:
    """The activation block a quantized type's kernel reads: 256 for the K-quants (one
    scale per 256, integer sub-block scales: llama.cpp's Q8_K), 32 otherwise (Q8_0);
    packed types as their ggml type."""
    return 256 if (ggml_type & ~PACKED) in K_QUANTS else 32


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
