"""Activations quantized per row for the integer kernels: int8 blocks of 32 with an fp16-rounded
scale (llama.cpp's Q8_0) or of 256 with a float32 scale (its Q8_K, for the K-form weights), in C,
or in torch where the kernels are not built (the same numbers)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from loraserve import kernels as K


class QuantizedRows(NamedTuple):
    """Activations quantized per row in blocks of ``block`` (32 or 256): x ≈ q * d."""

    q: torch.Tensor  # [M, K] int8
    d: torch.Tensor  # [M, K/block] float32 block scales
    ms: torch.Tensor  # [M, K/16]: block 32: float32 d * sum(q); block 256: int16 sum(q)
    x: torch.Tensor  # [M, K] the float32 input (for float-weight parts of the same input)
    block: int = 32
    bs32: torch.Tensor | None = None  # [M, K/32] int16 sum(q) over each 32


def quantize_rows(x: torch.Tensor, block: int = 32) -> QuantizedRows:
    """x: [M, K] float32, K a multiple of ``block`` (32, or 256 for K-quant weights) ->
    its `QuantizedRows`."""
    if block not in (32, 256):
        raise ValueError(f"activation blocks are 32 or 256 values, not {block}")
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] % block:
        raise ValueError(
            f"quantize_rows needs float32 [M, K*{block}], got {x.dtype} {tuple(x.shape)}"
        )
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8)
    d = torch.empty(m, k // block)
    ms = torch.empty(m, k // 16, dtype=torch.float32 if block == 32 else torch.int16)
    lib = K._c()
    if lib is None:
        return _quantize_torch(x, q, d, ms, block)
    n = torch.get_num_threads()
    b32 = torch.empty(m, k // 32, dtype=torch.int16)
    if block == 32:
        _ok(lib.ls_quantize_rows(x.data_ptr(), m, k, x.stride(0), q.data_ptr(), d.data_ptr(),
                             ms.data_ptr(), b32.data_ptr(), n), "quantize_rows")  # fmt: skip
    else:
        _ok(lib.ls_quantize_rows_k(x.data_ptr(), m, k, x.stride(0), q.data_ptr(), d.data_ptr(),
                               ms.data_ptr(), b32.data_ptr(), n), "quantize_rows_k")  # fmt: skip
    return QuantizedRows(q, d, ms, x, block, b32)


def _ok(rc: int, what: str) -> None:
    """A C entry point's refusal (-3: sizes that do not fit, issue 31) as an exception."""
    if rc != 0:
        raise ValueError(f"{what}: sizes that do not fit the C kernel ({rc})")


def _quantize_torch(
    x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, ms: torch.Tensor, block: int
) -> QuantizedRows:
    m, k = x.shape
    xb = x.reshape(m, k // block, block)
    amax = xb.abs().amax(-1)  # [M, K/block]
    nz = amax != 0
    inv = torch.where(nz, 127.0 / torch.where(nz, amax, 1.0), 0.0)  # ggml's id = 127 / amax
    v = xb * inv.unsqueeze(-1)
    qi = torch.round(v).nan_to_num(0.0)  # ties to even, as C's rintf
    q.copy_(qi.reshape(m, k))
    if block == 32:  # Q8_0: an fp16 scale; Q8_K: 1 / id in float32
        dd = torch.where(nz, (amax / 127.0).half().float(), 0.0)
    else:
        dd = torch.where(nz, 1.0 / torch.where(nz, inv, 1.0), 0.0)
    bad = ~torch.isfinite(xb).all(-1)
    d.copy_(torch.where(bad, torch.full_like(dd, float("nan")), dd))
    sums = qi.reshape(m, k // 16, 16).sum(-1)  # exact small integers
    b32 = sums.reshape(m, k // 32, 2).sum(-1).to(torch.int16)
    if block == 32:
        ms.copy_(d.repeat_interleave(2, dim=1) * sums)
    else:
        ms.copy_(sums.to(torch.int16))
    return QuantizedRows(q, d, ms, x, block, b32)
