"""Latent attention's query and cache rows in one C call (`mla_prep.h`, deepseek2's
`model.attn.mla`): the step's small tensor operations around its attention kernel, with the
same float operations, so the same bits as the tensor path it replaces."""

from __future__ import annotations

import ctypes

import torch

from loraserve.cbuild import bind

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURE = {
    "ls_mla_prep": (
        [_P, _I, _P, _I, _P, _I, _I, _I, _I, _I, _I, _I, _P, _P, _F, _P, _P, _P, _I, _P, _I,
         ctypes.c_int, _P, ctypes.c_int],
        ctypes.c_int,
    )
}  # fmt: skip
_lib: list[ctypes.CDLL | None] = []


def available() -> bool:
    """Whether the C kernels (with ``ls_mla_prep``) are built here."""
    if not _lib:
        _lib.append(bind(_SIGNATURE))
    return _lib[0] is not None


def mla_prep(
    q: torch.Tensor,
    kv: torch.Tensor,
    kb: torch.Tensor,
    perm: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    qd: int,
) -> torch.Tensor:
    """The attention's query rows qa [T, H, rank + R] = [kb | rope(q_pe)] per head, and each
    token's cache row [RMSNorm(kv[:, :rank]) * w | rope(k_pe)] written at its slot.

    q: [T, H qd] float32 (head h's last R values its rope part, adjacent pairs); kv: [T, rank
    + R] float32; kb: [T, H, rank] float32 (any token and head strides); perm: [R] int64, the
    rope column of each halves-order position; w: [rank] float32; cos/sin: [T, R / 2];
    slots: [T] int64; k_cache: [S, 1, rank + R] float32 or float16 pool. Raises ValueError
    on shapes the kernel refuses.
    """
    t, h, rank = kb.shape
    r = perm.numel()
    lib = _lib[0] if _lib else None
    if lib is None:
        raise RuntimeError("the C kernels are not built here")
    if kb.stride(2) != 1:
        kb = kb.contiguous()
    q, kv = _rows(q), _rows(kv)
    cos, sin = cos.contiguous(), sin.contiguous()
    qa = torch.empty(t, h, rank + r)  # [T, H, rank + R]
    rc = lib.ls_mla_prep(
        q.data_ptr(), q.stride(0), kv.data_ptr(), kv.stride(0), kb.data_ptr(), kb.stride(0),
        kb.stride(1), t, h, qd, rank, r, perm.data_ptr(), w.data_ptr(), eps, cos.data_ptr(),
        sin.data_ptr(), slots.data_ptr(), k_cache.shape[0], k_cache.data_ptr(),
        k_cache.stride(0), int(k_cache.dtype == torch.float16), qa.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise ValueError(f"mla_prep: sizes or slots the kernel refuses ({rc})")
    return qa


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, N] with unit column stride (rows at any stride)."""
    return x if x.stride(1) == 1 else x.contiguous()
