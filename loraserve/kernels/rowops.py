"""Row-wise decoder operations in C (`rowops.c`), with torch fallbacks: RMSNorm."""

from __future__ import annotations

import ctypes

import torch

from loraserve.kernels.build import library

_lib: ctypes.CDLL | None = None
_loaded = False


def _c() -> ctypes.CDLL | None:
    global _lib, _loaded
    if not _loaded:
        _lib = library("rowops")
        if _lib is not None:
            p, i = ctypes.c_void_p, ctypes.c_int64
            _lib.ls_rms_norm.argtypes = [p, i, i, i, i, p, i, ctypes.c_float, p, ctypes.c_int]
            _lib.ls_rms_norm.restype = None
        _loaded = True
    return _lib


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in float32: x [T, K] or [T, H, K] (rows of a token may be a
    view into a wider row, as q|k heads in a fused projection's output), weight [K] or
    [H, K] -> a new contiguous float32 tensor of x's shape. Each row's result depends on that
    row alone."""
    lib = _c()
    three = x.dim() == 3
    ok = (
        lib is not None
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.is_contiguous()
        and x.dim() in (2, 3)
        and x.stride(-1) == 1
        and (not three or x.stride(1) == x.shape[2])
    )
    if not ok:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight
        return y.to(x.dtype) if x.dtype != torch.float32 else y
    t, k = x.shape[0], x.shape[-1]
    h = x.shape[1] if three else 1
    y = torch.empty(x.shape)
    hw = 1 if weight.dim() == 1 else weight.shape[0]
    lib.ls_rms_norm(x.data_ptr(), t, h, k, x.stride(0), weight.data_ptr(), hw, eps,
                    y.data_ptr(), torch.get_num_threads())  # fmt: skip
    return y
