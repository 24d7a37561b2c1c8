"""Float matmuls with one fixed summation order per output (`floatmm.c`, torch fallbacks):
F32/F16/BF16 weight rows (`fmatmul`) and a step's LoRA deltas (`lora_delta`). Every output
row depends on its own input row alone, like the quantized kernels of `loraserve.kernels`."""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from loraserve.cbuild import bind

_P, _I, _CI = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "ls_fmatmul": ([_CI, _P, _I, _I, _I, _P, _I, _I, _P, _I, _CI], _CI),
    "ls_lora": ([_CI, _P, _P, _P, _P, _P, _P, _I, _I, _I, _P, _I, _I, _CI], _CI),
}
_flib: ctypes.CDLL | None = None
_floaded = False


def _cf() -> ctypes.CDLL | None:
    global _flib, _floaded
    if not _floaded:
        _flib, _floaded = bind(_SIGNATURES), True
    return _flib


def backend() -> str:
    """'c' when the float kernels (LoRA, float weights) are compiled, 'torch' otherwise."""
    return "c" if _cf() is not None else "torch"


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
        return rowwise_torch(x, w.float(), out)
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    if out.stride(1) != 1:
        raise ValueError("fmatmul needs a unit column stride for out")
    if out.shape != (m, n):
        raise ValueError(f"fmatmul: out {tuple(out.shape)} for [{m}, {n}]")
    gtype = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30}.get(w.dtype)
    if gtype is None:
        raise ValueError(f"fmatmul: no kernel for {w.dtype} weights")
    rc = lib.ls_fmatmul(gtype, w.data_ptr(), n, k, _ld(w) * w.element_size(), x.data_ptr(),
                        _ld(x), m, out.data_ptr(), _ld(out), torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise ValueError(f"fmatmul: sizes do not fit (x [{m}, {k}], w [{n}, {k}]): {rc}")
    return out


def _ld(t: torch.Tensor) -> int:
    """A 2-D tensor's row stride as the kernels read it (a single row's: its width)."""
    return t.stride(0) if t.shape[0] > 1 else max(t.stride(0), t.shape[1])


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
    k, n_out = x.shape[1], y.shape[1]
    for a, b in pairs:
        fits = a.dim() == b.dim() == 2 and a.shape[1] == k and b.shape[0] == n_out
        if not (fits and a.shape[0] == b.shape[1] and a.is_contiguous() and b.is_contiguous()):
            raise ValueError(
                f"lora_delta: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit x [T, {k}] "
                f"and y [T, {n_out}] (A [r, in], B [out, r], contiguous)"
            )
    if tuple(scales.shape) != (n, t) or y.shape[0] != t:
        raise ValueError(f"lora_delta: scales {tuple(scales.shape)} for {n} adapters, {t} rows")
    as_ = (ctypes.c_void_p * n)(*[a.data_ptr() for a, _ in pairs])
    bs_ = (ctypes.c_void_p * n)(*[b.data_ptr() for _, b in pairs])
    ranks = (ctypes.c_int64 * n)(*[a.shape[0] for a, _ in pairs])
    scales = scales.contiguous()
    scales = scales.float()
    rc = lib.ls_lora(n, as_, bs_, None, ranks, scales.data_ptr(), x.data_ptr(), _ld(x), t,
                     x.shape[1], y.data_ptr(), _ld(y), y.shape[1],
                     torch.get_num_threads())  # fmt: skip
    if rc == -3:
        raise ValueError("lora_delta: sizes do not fit")
    if rc != 0:
        raise MemoryError("lora_delta: out of memory")
    return y


def rowwise_torch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[i] = x[i] W^T, one single-row product per row (the torch fallbacks' matmul)."""
    # one product per row: the same single-row call whatever the batch, so row-independent
    for i in range(x.shape[0]):
        out[i] = F.linear(x[i : i + 1], w)[0]
    return out
