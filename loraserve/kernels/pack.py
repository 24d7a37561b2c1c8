"""Weight rows repacked once at load 8 rows to a group (``kernels/packed.h``: a vector's lanes
are 8 weight rows, the layout prompt-sized matmuls run fastest on), and back."""

from __future__ import annotations

import os

import torch

from loraserve import kernels as K
from loraserve.kernels.hugebuf import empty_u8

# Q4_0, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ4_NL, IQ4_XS, TQ2_0, MXFP4. Q6_K's layout is
# packed_q6.h's (the grouped expert kernels' pack_q6k.h, byte for byte): measured (Zen 5,
# 2 threads, Gemma 1B shapes) against its own layout, 1 / 4 / 512 rows 0.83 / 2.01 / 1.17x
# llama.cpp's time ratio instead of 0.60 / 1.06 / 0.53, and Q4_K_M prefills 2.32-2.45x
# llama-server's instead of 2.04-2.31x
PACKABLE = frozenset({2, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 35, 39})
PACK_ROWS = 8


def pack_rows(
    raw: torch.Tensor, ggml_type: int, k: int, out: torch.Tensor | None = None
) -> torch.Tensor | None:
    """ggml rows [N, row_bytes] uint8 -> the same values repacked 8 rows to a group
    (``kernels/packed.h``: a vector's lanes are 8 weight rows, the layout prompt-sized
    matmuls run fastest on), as [N, group_bytes / 8] uint8 for the kernel type
    ``PACKED | ggml_type``; None where the type, the row count or the backend has no
    packed kernel (the rows then stay as they are). ``LORASERVE_KERNEL_NO_PACK=1`` keeps
    every matrix in the file's layout (for side-by-side measurements). Written into
    ``out`` (contiguous [N, `packed_width`]) when given, else into a new buffer on huge
    pages where it spans one (`hugebuf`)."""
    lib = K._c()
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
    if out is None:
        out = empty_u8(n, gb // PACK_ROWS)
    elif out.shape != (n, gb // PACK_ROWS) or not out.is_contiguous():
        raise ValueError(f"pack_rows: out {tuple(out.shape)} for [{n}, {gb // PACK_ROWS}]")
    rc = lib.ls_repack(ggml_type, raw.data_ptr(), n, k, raw.stride(0), out.data_ptr(), 1,
                       torch.get_num_threads())  # fmt: skip
    return out if rc == 0 else None


def packed_width(ggml_type: int, k: int, n: int) -> int | None:
    """Bytes per row of `pack_rows`' output for n rows of k values of the type (None: those
    rows stay unpacked)."""
    lib = K._c()
    if os.environ.get("LORASERVE_KERNEL_NO_PACK") == "1":
        return None
    if lib is None or ggml_type not in PACKABLE or n % PACK_ROWS or n == 0:
        return None
    gb = lib.ls_packed_group_bytes(ggml_type, k)
    return gb // PACK_ROWS if gb > 0 else None


def unpack_rows(packed: torch.Tensor, ggml_type: int, k: int, row_bytes: int) -> torch.Tensor:
    """The inverse of `pack_rows`: packed [N, *] -> the file's rows [N, row_bytes] uint8."""
    lib = K._c()
    if lib is None:
        raise RuntimeError("packed rows need the C kernels")
    out = torch.empty(packed.shape[0], row_bytes, dtype=torch.uint8)
    rc = lib.ls_repack(ggml_type, out.data_ptr(), packed.shape[0], k, row_bytes,
                       packed.data_ptr(), 0, torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise ValueError(f"rows of ggml type {ggml_type} are not packed ones")
    return out
