"""What `layers.FusedLayers` is built from: each layer's projections (`ProjSpec`), norms,
mixer and FFN (`LayerSpec`, `MambaSpec`, `GdnSpec`, `ConvSpec`), the checks of their widths,
and their C structures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from loraserve.kernels import gdn_chunk
from loraserve.kernels.layers_abi import (
    FFN_GATED,
    FFN_NONE,
    FFN_RELU_SQR,
    ConvC,
    GdnC,
    MambaC,
    ProjC,
)


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
    [n_heads + n_kv_heads, head_dim]; None where the architecture has none). qkv and o None:
    no mixer, the FFN alone on ffn_norm (nemotron-h's "ffn" layers); gate_up and down None:
    no FFN, the mixer alone (mamba2, nemotron-h's others; ffn_norm None)."""

    qkv: ProjSpec | None
    o: ProjSpec | None
    gate_up: ProjSpec | None
    down: ProjSpec | None
    attn_norm: torch.Tensor
    qk_norm: torch.Tensor | None
    post_attn_norm: torch.Tensor | None
    ffn_norm: torch.Tensor | None
    post_ffn_norm: torch.Tensor | None
    sliding: bool
    rope: bool = True  # False: q and k attend as projected (qk_norm None)
    mamba: MambaSpec | None = None  # a Mamba-2 mixer: qkv its ssm_in, o ssm_out (or beside)
    gdn: GdnSpec | None = None  # a gated delta-net mixer: qkv its in-projection, o ssm_out
    conv: ConvSpec | None = None  # a short-convolution mixer: qkv its in_proj, o out_proj
    relu_sqr: bool = False  # the FFN is relu(up)^2, no gate (gate_up [F], not [2 F])
    # the Mamba-2 mixer's projections where it runs beside the attention (falcon-h1: their
    # outputs summed); qkv and o are then the attention's
    ssm_in: ProjSpec | None = None
    ssm_out: ProjSpec | None = None

    @property
    def recurrent(self) -> MambaSpec | GdnSpec | ConvSpec | None:
        """The layer's recurrent mixer (state records each step), if any."""
        return self.mamba or self.gdn or self.conv

    @property
    def attends(self) -> bool:
        """Whether the layer is attention's (reads and writes its KV pool)."""
        return self.qkv is not None and (self.recurrent is None or self.ssm_in is not None)

    @property
    def projections(self) -> tuple[ProjSpec | None, ...]:
        """The layer's projections in LoRA slot order (layers.h's LS_PROJS)."""
        return self.qkv, self.o, self.gate_up, self.down, self.ssm_in, self.ssm_out

    @property
    def ffn_form(self) -> int:
        """layers.h's LS_FFN_*: gated, none or relu(up)^2."""
        return FFN_NONE if self.gate_up is None else FFN_RELU_SQR if self.relu_sqr else FFN_GATED


@dataclass(frozen=True)
class ConvSpec:
    """A short-convolution mixer's taps [L, C] float32 contiguous (`recurrent.shortconv`)."""

    taps: torch.Tensor

    @property
    def state_size(self) -> int:
        """One sequence's state record: the last L-1 rows of b*x, [L-1, C]."""
        k, c = self.taps.shape
        return (k - 1) * c

    def c_struct(self) -> ConvC:
        """The C structure pointing into the taps (they must outlive it)."""
        t = self.taps
        if t.dim() != 2 or t.shape[0] < 2 or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"short conv: taps {tuple(t.shape)} {t.dtype}, not [L >= 2, C]")
        return ConvC(t.data_ptr(), t.shape[1], t.shape[0])


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


@dataclass(frozen=True)
class GdnSpec:
    """A gated delta-net mixer's tensors (`recurrent.deltanet.GatedDeltaNet`), float32
    contiguous: taps [L, C] (C = 2 Hk S + Hv S), ones [C], ones_s [S], norm [S], dt_b and a
    [Hv]; ba_cols [2 Hv] int64 (beta's then alpha's column among the in-projection's last
    2 Hv values); eps (the output norm's), eps_qk (q's and k's: eps / S), scale (1 / sqrt(S));
    dims (Hk, Hv, S, L); interleave: value head h reads key head h / (Hv / Hk), else h % Hk;
    chunk > 0: `--scan-form chunked`'s records (`gdn_chunk.scan_size`), whose decode
    rows also keep the chunked record."""

    taps: torch.Tensor
    ones: torch.Tensor
    ones_s: torch.Tensor
    norm: torch.Tensor
    dt_b: torch.Tensor
    a: torch.Tensor
    ba_cols: torch.Tensor
    eps: float
    eps_qk: float
    scale: float
    dims: tuple[int, int, int, int]
    interleave: bool
    chunk: int = 0

    @property
    def state_size(self) -> int:
        """One sequence's state record: the conv rows [(L-1) C], then M [Hv S S] (chunked:
        the carried chunk record and a flag before M)."""
        hk, hv, s, k = self.dims
        return (k - 1) * (2 * hk * s + hv * s) + gdn_chunk.scan_size(hv, s, self.chunk)

    @property
    def in_width(self) -> int:
        """The in-projection's output width: q|k|v, z, beta|alpha."""
        hk, hv, s, _ = self.dims
        return 2 * hk * s + 2 * hv * s + 2 * hv

    def c_struct(self) -> GdnC:
        """The C structure pointing into these tensors (they must outlive it)."""
        hk, hv, s, k = self.dims
        want = [(self.taps, k * (2 * hk * s + hv * s)), (self.ones, 2 * hk * s + hv * s),
                (self.ones_s, s), (self.norm, s), (self.dt_b, hv), (self.a, hv)]  # fmt: skip
        for t, m in want:
            if t.numel() != m or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"delta-net: a tensor of {t.numel()} values, not {m}")
        cols = self.ba_cols
        if cols.dtype != torch.int64 or cols.numel() != 2 * hv or not cols.is_contiguous() \
                or int(cols.min()) < 0 or int(cols.max()) >= 2 * hv or hv % hk:  # fmt: skip
            raise ValueError("delta-net: beta/alpha columns outside the in-projection's 2 Hv")
        if not 0 <= self.chunk <= 256:
            raise ValueError(f"delta-net: chunk {self.chunk} outside 0 .. 256")
        return GdnC(*(ptr(t) for t, _ in want), cols.data_ptr(), self.eps, self.eps_qk,
                    self.scale, hk, hv, s, k, int(self.interleave), self.chunk)  # fmt: skip


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def numel(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel()


def mixer_widths(
    L: LayerSpec, hidden: int, nq: int, nkv: int, d: int, out_gate: bool = False
) -> tuple[int, ...]:
    """(qkv input, qkv output, o input) widths of layer L's mixer: attention's (q|k|v, each
    q head followed by its output gate with ``out_gate``), for a Mamba-2 mixer ssm_in's
    [hidden -> 2 H P + 2 G N + H] and ssm_out's input H P, for a delta-net mixer its
    in-projection's q|k|v, z, beta|alpha and ssm_out's input Hv S, for a short conv in_proj's
    b|c|x [3 C] and out_proj's input C."""
    if L.gdn is not None:
        hk, hv, s, _ = L.gdn.dims
        return hidden, L.gdn.in_width, hv * s
    if L.conv is not None:
        c = L.conv.taps.shape[1]
        return hidden, 3 * c, c
    if L.mamba is None or L.ssm_in is not None:  # attention (beside a Mamba-2 mixer too)
        return hidden, (nq + 2 * nkv) * d + (nq * d if out_gate else 0), nq * d
    return mamba_widths(L.mamba, hidden)


def mamba_widths(mb: MambaSpec, hidden: int) -> tuple[int, int, int]:
    """(ssm_in input, ssm_in output, ssm_out input) widths of Mamba-2 mixer mb."""
    h, p, n, g, _ = mb.dims
    return hidden, 2 * h * p + 2 * g * n + h, h * p


def check_layer(i: int, L: LayerSpec, hidden: int, nq: int, nkv: int, d: int, ffn: int,
                out_gate: bool = False) -> None:  # fmt: skip
    """Layer i's projections and norms have the widths the C call sizes its buffers for:
    ValueError naming the first that does not (the C call checks the same, -3)."""
    if sum(m is not None for m in (L.mamba, L.gdn, L.conv)) > 1:
        raise ValueError(f"fused layers: layer {i} has two recurrent mixers")
    if (L.qkv is None) != (L.o is None) or (L.gate_up is None) != (L.down is None) \
            or (L.qkv is None and (L.gate_up is None or L.recurrent is not None)):  # fmt: skip
        raise ValueError(f"fused layers: layer {i} lacks half a mixer or an FFN, or has neither")
    if (L.ssm_in is None) != (L.ssm_out is None) or (L.ssm_in is not None and L.mamba is None):
        raise ValueError(f"fused layers: layer {i} has half a Mamba-2 mixer beside attention")
    if ((L.recurrent is not None and L.ssm_in is None) or not L.rope or L.qkv is None) \
            and L.qk_norm is not None:  # fmt: skip
        raise ValueError(f"fused layers: layer {i} has a q/k norm without rope or attention")
    side = 0 if L.mamba is None else mamba_widths(L.mamba, hidden)[1]
    want = {"qkv": (L.qkv, mixer_widths(L, hidden, nq, nkv, d, out_gate)[1]),
            "o": (L.o, hidden), "gate_up": (L.gate_up, ffn * (1 if L.relu_sqr else 2)),
            "down": (L.down, hidden), "ssm_in": (L.ssm_in, side),
            "ssm_out": (L.ssm_out, hidden)}  # fmt: skip
    for name, (p, n_out) in want.items():
        if p is None:
            continue
        rows = sum(raw.shape[0] for raw, _, _ in p.parts)
        if p.n_out != n_out or rows != n_out:
            raise ValueError(
                f"fused layers: layer {i} {name} has {rows} output rows ({p.n_out} declared), "
                f"the model's sizes need {n_out}"
            )
        if p.bias is not None and p.bias.numel() != n_out:
            raise ValueError(f"fused layers: layer {i} {name} bias of {p.bias.numel()} values")
    if L.gate_up is not None and L.ffn_norm is None:
        raise ValueError(f"fused layers: layer {i} has an FFN without its norm")
    norms = {"attn_norm": (L.attn_norm, hidden), "qk_norm": (L.qk_norm, (nq + nkv) * d),
             "post_attn_norm": (L.post_attn_norm, hidden), "ffn_norm": (L.ffn_norm, hidden),
             "post_ffn_norm": (L.post_ffn_norm, hidden)}  # fmt: skip
    for name, (t, n) in norms.items():
        if t is not None and (t.numel() != n or t.dtype != torch.float32 or not t.is_contiguous()):
            raise ValueError(
                f"fused layers: layer {i} {name} holds {t.numel()} {t.dtype} values, the model's "
                f"sizes need {n} contiguous float32"
            )


def proj_struct(p: ProjSpec | None) -> ProjC:
    """The C structure of projection p (pointing into its tensors); none: no parts."""
    s = ProjC()
    if p is None:
        return s
    s.nparts, s.n_out, s.bias = len(p.parts), p.n_out, ptr(p.bias)
    for i, (raw, t, col) in enumerate(p.parts):
        s.types[i], s.ws[i], s.ns[i] = t, raw.data_ptr(), raw.shape[0]
        s.row_bytes[i], s.cols[i] = raw.stride(0), col
    return s
