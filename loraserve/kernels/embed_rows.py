"""Looked-up rows of a quantized embedding table to float32 in one C call (`embed_rows.c`):
the same float32 products as `model.dequant`'s torch routine (Q6_K, Q8_0), without its ~20
small tensors per lookup."""

from __future__ import annotations

import ctypes

import torch

from loraserve.cbuild import bind

_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {"ls_dequant_rows": ([ctypes.c_int, _P, _I, _I, _I, _P], ctypes.c_int)}
TYPES = frozenset({8, 14})  # Q8_0, Q6_K
_lib: list[ctypes.CDLL | None] = []


def dequant_rows(rows: torch.Tensor, ggml_type: int, k: int) -> torch.Tensor | None:
    """rows [T, row_bytes] uint8 of ``ggml_type`` holding k values each -> [T, k] float32,
    or None where this does not read them (another type, no C library, a scale that is not
    finite): the caller's `dequant.dequantize` then gives the same values."""
    if ggml_type not in TYPES or rows.dtype != torch.uint8 or rows.dim() != 2:
        return None
    if not _lib:
        _lib.append(bind(_SIGNATURES))
    lib = _lib[0]
    if lib is None:
        return None
    rows = rows.contiguous()
    out = torch.empty(rows.shape[0], k)
    rc = lib.ls_dequant_rows(ggml_type, rows.data_ptr(), rows.shape[0], k, rows.shape[1],
                             out.data_ptr())  # fmt: skip
    return out if rc == 0 else None
