"""Argument checks of the recurrent kernels' Python wrappers (issue 31's rule, Python side),
and the ctypes arrays they pass (`int64s`, `pointers`).

A wrapper hands the C code raw pointers and sizes, so every tensor it passes is checked here
first to be what the C code will read or write (a CPU float32 tensor of the values it takes,
in the layout it assumes) and every row span to lie inside the rows given. A crafted
argument raises ValueError; it never reaches C as a short buffer."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch


def f32(what: str, t: torch.Tensor | None, numel: int | None = None, *, contiguous: bool = True,
        shape: tuple[int, ...] | None = None) -> None:  # fmt: skip
    """Raise ValueError unless ``t`` is a CPU float32 tensor (None passes) with ``numel``
    values and/or of ``shape``, contiguous unless told otherwise."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device.type != "cpu":
        raise ValueError(f"{what}: a CPU float32 tensor needed")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{what}: {t.numel()} values, expected {numel}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{what}: shape {tuple(t.shape)}, expected {shape}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{what}: a contiguous tensor needed")


def rows(what: str, t: torch.Tensor, width: int) -> None:
    """Raise ValueError unless ``t`` is CPU float32 rows [T, >= width] of unit stride, each row
    read as ``width`` values from its start."""
    f32(what, t, contiguous=False)
    if t.dim() != 2 or t.shape[1] < width or (t.shape[1] > 1 and t.stride(1) != 1):
        raise ValueError(f"{what}: rows {tuple(t.shape)} of unit stride and {width}+ values needed")


def spans(what: str, sp: Sequence[tuple[int, int]], t: int, *lists: Sequence[object]) -> None:
    """Raise ValueError unless every span (lo, hi) has 0 <= lo <= hi <= t and each of
    ``lists`` (per-sequence states, snapshots) has one entry per span."""
    if any(not 0 <= lo <= hi <= t for lo, hi in sp):
        raise ValueError(f"{what}: row spans {list(sp)} outside {t} rows")
    if any(len(x) != len(sp) for x in lists):
        got = [len(x) for x in lists]
        raise ValueError(f"{what}: {len(sp)} spans but {got} per-sequence entries")


def int64s(xs: Sequence[int]) -> ctypes.Array[ctypes.c_int64]:
    """``xs`` as a C int64 array (at least one element, so empty lists pass a valid pointer)."""
    return (ctypes.c_int64 * max(1, len(xs)))(*xs)


def pointers(ts: Sequence[torch.Tensor]) -> ctypes.Array[ctypes.c_void_p]:
    """The data pointers of ``ts`` as a C array (at least one element)."""
    return (ctypes.c_void_p * max(1, len(ts)))(*(t.data_ptr() for t in ts))
