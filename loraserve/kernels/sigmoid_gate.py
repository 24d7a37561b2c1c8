"""The attention output gate of qwen3next / qwen35 (``attn_out_gate``) in C, one value at a
time: the very function the fused layers (`layers.c`, `layers_attn.h`) call, for the per-layer
path."""

from __future__ import annotations

import torch

from loraserve.cbuild import lazy_bind
from loraserve.kernels.layers_abi import SIGNATURES as _SIGNATURES

_c = lazy_bind(_SIGNATURES)  # bound once, not on every call


def sigmoid_gate(a: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """a [T, H D] (contiguous) times sigmoid(gate) [T, H, D] (unit stride in D; any row and
    head strides): each sigmoid in double, rounded to float32, then the product, one value
    at a time (`layers_attn.h`, which the fused layers call too: the same bits in any batch).
    Without the C kernels: torch's double sigmoid."""
    lib = _c()
    t, h, d = gate.shape
    a = a.contiguous()
    if lib is None or a.dtype != torch.float32 or gate.dtype != torch.float32 \
            or a.device.type != "cpu" or gate.device.type != "cpu" \
            or gate.stride(2) != 1 or a.shape != (t, h * d):  # fmt: skip
        return a * torch.sigmoid(gate.double()).float().reshape(t, h * d)
    out = torch.empty(t, h * d)
    rc = lib.ls_sigmoid_gate(a.data_ptr(), h * d, gate.data_ptr(), gate.stride(0),
                             gate.stride(1), t, h, d, out.data_ptr())  # fmt: skip
    if rc != 0:
        raise ValueError(f"sigmoid_gate: a {tuple(a.shape)}, gate {tuple(gate.shape)}")
    return out
