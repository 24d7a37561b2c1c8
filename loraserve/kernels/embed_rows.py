"""Looked-up rows of a quantized embedding table to float32 in one C call (`embed_rows.c`):
the same float32 products as `model.dequant`'s torch routine (Q6_K, Q8_0), without its ~20
small tensors per lookup."""

from __future__ import annotations

import ctypes

import torch

from loraserve.cbuild import bind

_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "ls_dequant_rows": ([ctypes.c_int, _P, _I, _I, _I, _P], ctypes.c_int),
    "ls_dequant_packed_rows": ([ctypes.c_int, _P, _I, _I, _P, _I, _I, _I, _P], ctypes.c_int),
}
TYPES = frozenset({8, 14})  # Q8_0, Q6_K
_lib: list[ctypes.CDLL | None] = []


def _bound() -> ctypes.CDLL | None:
    if not _lib:
        _lib.append(bind(_SIGNATURES))
    return _lib[0]


def dequant_rows(rows: torch.Tensor, ggml_type: int, k: int) -> torch.Tensor | None:
    """rows [T, row_bytes] uint8 of ``ggml_type`` holding k values each -> [T, k] float32,
    or None where this does not read them (another type, no C library, a scale that is not
    finite): the caller's `dequant.dequantize` then gives the same values."""
    if ggml_type not in TYPES or rows.dtype != torch.uint8 or rows.dim() != 2:
        return None
    lib = _bound()
    if lib is None:
        return None
    rows = rows.contiguous()
    out = torch.empty(rows.shape[0], k)  # [T, k]
    rc = lib.ls_dequant_rows(ggml_type, rows.data_ptr(), rows.shape[0], k, rows.shape[1],
                             out.data_ptr())  # fmt: skip
    return out if rc == 0 else None


def dequant_packed_rows(packed: torch.Tensor, ids: torch.Tensor, ggml_type: int, k: int,
                        row_bytes: int) -> torch.Tensor | None:  # fmt: skip
    """Rows ``ids`` [T] int64 of a table packed 8 rows to a group (``packed`` [V, group_bytes
    / 8] uint8 contiguous, `kernels.pack.pack_rows`) -> [T, k] float32 in one C call: each
    row's group unpacked to the file's ``row_bytes`` bytes, then `dequant_rows` of it (the
    same values). None where this does not read them (another type, no C library, an id out
    of range, a scale that is not finite): the caller's unpack-and-dequantize path then
    gives the answer (or the error)."""
    if ggml_type not in TYPES or packed.dtype != torch.uint8 or not packed.is_contiguous() \
            or ids.dtype != torch.int64 or ids.dim() != 1 or not ids.is_contiguous():  # fmt: skip
        return None
    lib = _bound()
    if lib is None:
        return None
    out = torch.empty(ids.shape[0], k)  # [T, k]
    rc = lib.ls_dequant_packed_rows(ggml_type, packed.data_ptr(), packed.shape[0],
                                    8 * packed.shape[1], ids.data_ptr(), ids.shape[0], k,
                                    row_bytes, out.data_ptr())  # fmt: skip
    return out if rc == 0 else None
