"""What `layers.FusedLayers` is built from: each layer's projections (`ProjSpec`), norms and
mixer (`LayerSpec`, `MambaSpec`), the checks of their widths, and their C structures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from loraserve.kernels.layers_abi import MambaC, ProjC


def halves(t: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``t`` is a contiguous float16 tensor of ``shape`` (an adapter's exact halves:
    `lora.adapter.LoraWeight`)."""
    return isinstance(t, torch.Tensor) and t.dtype == torch.float16 and t.is_contiguous() \
        and tuple(t.shape) == shape  # fmt: skip


@dataclass(frozen=True)
class ProjSpec:
    """One projection: quantized parts (rows [N_i, row_bytes] uint8, ggml type, first
    output column), its output width, optional bias [n_out] float32 and each part's tensor
    name (the LoRA target it is)."""

    parts: list[tuple[torch.Tensor, int, int]]
    n_out: int
    bias: torch.Tensor | None
    names: tuple[str, ...]


@dataclass(frozen=True)
class LayerSpec:
    """One dense layer's projections and norms (float32 [hidden] or, for qk_norm,
    [n_heads + n_kv_heads, head_dim]; None where the architecture has none)."""

    qkv: ProjSpec
    o: ProjSpec
    gate_up: ProjSpec
    down: ProjSpec
    attn_norm: torch.Tensor
    qk_norm: torch.Tensor | None
    post_attn_norm: torch.Tensor | None
    ffn_norm: torch.Tensor
    post_ffn_norm: torch.Tensor | None
    sliding: bool
    rope: bool = True  # False: q and k attend as projected (qk_norm None)
    mamba: MambaSpec | None = None  # a Mamba-2 mixer: qkv is its ssm_in, o its ssm_out


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba-2 mixer's tensors (`recurrent.mamba2.Mamba2`), float32 contiguous: taps
    [L, C] (C = H P + 2 G N), conv_b [C] or None, ones [C], d [H], norm [G, H P / G] or None,
    dt_b and a [H]; dims (H, P, N, G, L)."""

    taps: torch.Tensor
    conv_b: torch.Tensor | None
    ones: torch.Tensor
    d: torch.Tensor
    norm: torch.Tensor | None
    dt_b: torch.Tensor
    a: torch.Tensor
    dims: tuple[int, int, int, int, int]

    @property
    def state_size(self) -> int:
        """One sequence's state record: the conv rows [(L-1) C], then the scan's [H P N]."""
        h, p, n, g, k = self.dims
        return (k - 1) * (h * p + 2 * g * n) + h * p * n

    def c_struct(self) -> MambaC:
        """The C structure pointing into these tensors (they must outlive it)."""
        h, p, n, g, k = self.dims
        c = h * p + 2 * g * n
        want = [(self.taps, k * c), (self.conv_b, c), (self.ones, c), (self.d, h),
                (self.norm, h * p), (self.dt_b, h), (self.a, h)]  # fmt: skip
        for t, m in want:
            if t is not None and (t.numel() != m or t.dtype != torch.float32
                                  or not t.is_contiguous()):  # fmt: skip
                raise ValueError(f"fused layers: a Mamba-2 tensor of {t.numel()} values, not {m}")
        return MambaC(*(ptr(t) for t, _ in want), h, p, n, g, k)


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def numel(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel()


def mixer_widths(L: LayerSpec, hidden: int, nq: int, nkv: int, d: int) -> tuple[int, ...]:
    """(qkv input, qkv output, o input) widths of layer L's mixer: attention's, or for a
    Mamba-2 mixer ssm_in's [hidden -> 2 H P + 2 G N + H] and ssm_out's input H P."""
    if L.mamba is None:
        return hidden, (nq + 2 * nkv) * d, nq * d
    h, p, n, g, _ = L.mamba.dims
    return hidden, 2 * h * p + 2 * g * n + h, h * p


def check_layer(i: int, L: LayerSpec, hidden: int, nq: int, nkv: int, d: int, ffn: int) -> None:
    """Layer i's projections and norms have the widths the C call sizes its buffers for:
    ValueError naming the first that does not (the C call checks the same, -3)."""
    want = {"qkv": (L.qkv, mixer_widths(L, hidden, nq, nkv, d)[1]), "o": (L.o, hidden),
            "gate_up": (L.gate_up, 2 * ffn), "down": (L.down, hidden)}  # fmt: skip
    if (L.mamba is not None or not L.rope) and L.qk_norm is not None:
        raise ValueError(f"fused layers: layer {i} has a q/k norm without rope or attention")
    for name, (p, n_out) in want.items():
        rows = sum(raw.shape[0] for raw, _, _ in p.parts)
        if p.n_out != n_out or rows != n_out:
            raise ValueError(
                f"fused layers: layer {i} {name} has {rows} output rows ({p.n_out} declared), "
                f"the model's sizes need {n_out}"
            )
        if p.bias is not None and p.bias.numel() != n_out:
            raise ValueError(f"fused layers: layer {i} {name} bias of {p.bias.numel()} values")
    norms = {"attn_norm": (L.attn_norm, hidden), "qk_norm": (L.qk_norm, (nq + nkv) * d),
             "post_attn_norm": (L.post_attn_norm, hidden), "ffn_norm": (L.ffn_norm, hidden),
             "post_ffn_norm": (L.post_ffn_norm, hidden)}  # fmt: skip
    for name, (t, n) in norms.items():
        if t is not None and (t.numel() != n or t.dtype != torch.float32 or not t.is_contiguous()):
            raise ValueError(
                f"fused layers: layer {i} {name} holds {t.numel()} {t.dtype} values, the model's "
                f"sizes need {n} contiguous float32"
            )


def proj_struct(p: ProjSpec) -> ProjC:
    """The C structure of projection p (pointing into its tensors)."""
    s = ProjC()
    s.nparts, s.n_out, s.bias = len(p.parts), p.n_out, ptr(p.bias)
    for i, (raw, t, col) in enumerate(p.parts):
        s.types[i], s.ws[i], s.ns[i] = t, raw.data_ptr(), raw.shape[0]
        s.row_bytes[i], s.cols[i] = raw.stride(0), col
    return s
