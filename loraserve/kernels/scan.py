"""One pass over a step's logits (`ls_scan_rows` in `rowops.c`): the rows holding inf or
NaN, and each row's first maximum; torch fallbacks give the same answers."""

from __future__ import annotations

import ctypes

import torch

from loraserve.cbuild import bind

_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {"ls_scan_rows": ([_P, _I, _I, _I, _P, _P, ctypes.c_int], None)}
_lib: ctypes.CDLL | None = None
_loaded = False


def _c() -> ctypes.CDLL | None:
    global _lib, _loaded
    if not _loaded:
        _lib, _loaded = bind(_SIGNATURES), True
    return _lib


def scan_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, V] float32 (rows contiguous) -> (bad [R] bool: the row holds inf or NaN,
    top [R] int64: the first index of the row's maximum, as `torch.argmax`; for a bad row
    it is unspecified)."""
    rows, vocab = x.shape
    lib = _c()
    if lib is None or x.dtype != torch.float32 or x.device.type != "cpu" or x.stride(1) != 1:
        return ~torch.isfinite(x).all(dim=1), x.argmax(dim=1)
    bad = torch.empty(rows, dtype=torch.uint8)
    top = torch.empty(rows, dtype=torch.int64)
    lib.ls_scan_rows(x.data_ptr(), rows, vocab, x.stride(0), bad.data_ptr(), top.data_ptr(),
                     torch.get_num_threads())  # fmt: skip
    return bad.bool(), top
