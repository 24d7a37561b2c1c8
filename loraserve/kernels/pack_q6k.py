"""Q6_K expert rows repacked 8 to a group (``kernels/pack_q6k.h``: a vector's lanes are 8
weight rows) for the grouped expert matmuls, and back. The same bytes per row as the file's
(210 per 256 values), so only their order changes; the kernel type is ``PACKED | 14``."""

from __future__ import annotations

import ctypes

import torch

from loraserve.cbuild import bind

Q6_K = 14
PACK_ROWS = 8
_P, _I, _CI = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {"ls_repack_q6k": ([_P, _I, _I, _I, _P, _CI, _CI], _CI)}
_lib: ctypes.CDLL | None = None
_loaded = False


def _c() -> ctypes.CDLL | None:
    global _lib, _loaded
    if not _loaded:
        _lib, _loaded = bind(_SIGNATURES), True
    return _lib


def packable_q6k(raw: torch.Tensor, k: int) -> bool:
    """Whether Q6_K rows raw [N, row_bytes] of k values can be packed here."""
    n = raw.shape[0]
    return (_c() is not None and raw.dim() == 2 and n > 0 and n % PACK_ROWS == 0
            and k > 0 and k % 256 == 0 and raw.shape[1] >= k // 256 * 210)  # fmt: skip


def pack_q6k(raw: torch.Tensor, k: int) -> torch.Tensor:
    """Q6_K rows raw [N, row_bytes] uint8 (N a multiple of 8, k of 256) -> the packed rows
    [N, k / 256 * 210] uint8 (`packable_q6k` says whether they can be)."""
    lib = _c()
    if lib is None or not packable_q6k(raw, k):
        raise ValueError(f"Q6_K rows {tuple(raw.shape)} of {k} values cannot be packed")
    raw = raw.contiguous()
    out = torch.empty(raw.shape[0], k // 256 * 210, dtype=torch.uint8)
    rc = lib.ls_repack_q6k(raw.data_ptr(), raw.shape[0], k, raw.stride(0), out.data_ptr(), 1,
                           torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise ValueError(f"Q6_K rows {tuple(raw.shape)} of {k} values cannot be packed")
    return out


def unpack_q6k(packed: torch.Tensor, k: int) -> torch.Tensor:
    """The inverse of `pack_q6k`: packed [N, k / 256 * 210] -> the file's rows, same shape."""
    lib = _c()
    if lib is None:
        raise RuntimeError("packed Q6_K rows need the C kernels")
    packed = packed.contiguous()
    out = torch.empty(packed.shape[0], k // 256 * 210, dtype=torch.uint8)
    rc = lib.ls_repack_q6k(out.data_ptr(), packed.shape[0], k, out.stride(0), packed.data_ptr(),
                           0, torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise ValueError(f"packed Q6_K rows {tuple(packed.shape)} of {k} values")
    return out
