"""Which decoders run a step's layers in one C call (`kernels.layers.FusedLayers`), and the
layer specs that call is built from: dense layers whose attention is plain, gated (qwen35:
output gates, per-head q/k norms, a partial rope) or replaced by a Mamba-2 (granitehybrid) or
gated delta-net (qwen35, qwen3next) mixer, with a gated FFN; every projection quantized.
Anything else (MoE, float weights, sinks, soft-capping, ...) keeps the per-layer path."""

from __future__ import annotations

from collections.abc import Sequence

from loraserve import kernels
from loraserve.kernels import ssm_scan
from loraserve.kernels.layers import FusedLayers, LayerSpec, ProjSpec
from loraserve.model.block import Block
from loraserve.model.block import f32 as _f32
from loraserve.model.config import ModelConfig
from loraserve.model.projection import Projection
from loraserve.model.recurrent.deltanet import GatedDeltaNet
from loraserve.model.recurrent.mamba2 import Mamba2

__all__ = ["build_fused"]


def _proj(p: Projection) -> ProjSpec | None:
    if p._qparts is None or not all(m.quantized for m in p.parts) or len(p.parts) > 8:
        return None
    return ProjSpec(p._qparts.parts, p.out_features, p.bias, tuple(n for n, _, _ in p.spans))


def _layer(b: Block) -> LayerSpec | None:
    """Block b as the fused call's layer, or None where it needs the per-layer path."""
    mix = b.mixer  # attention, or a Mamba-2 / delta-net mixer in its place
    gdn = mix.fused_spec() if isinstance(mix, GatedDeltaNet) else None
    if b.moe is not None or not b.has_ffn or b.ffn_alone or b.beside or b.plain_ffn \
            or not (mix is None or isinstance(mix, Mamba2) or gdn is not None) \
            or (not b.rope and b.qk_norm is not None):  # fmt: skip
        return None
    mixes = (b.qkv, b.o) if mix is None else (mix.in_proj, mix.out_proj)  # type: ignore[union-attr]
    projs = [_proj(p) for p in (*mixes, b.gate_up, b.down)]
    if any(p is None for p in projs):
        return None
    qkv, o, gate_up, down = projs
    return LayerSpec(qkv, o, gate_up, down, b.attn_norm.contiguous(), b.qk_norm,  # type: ignore[arg-type]
                     _f32(b.post_attn_norm), b.ffn_norm.contiguous(), _f32(b.post_ffn_norm),
                     bool(b.sliding), bool(b.rope),
                     mix.fused_spec() if isinstance(mix, Mamba2) else None, gdn)  # fmt: skip


def build_fused(cfg: ModelConfig, blocks: Sequence[Block]) -> FusedLayers | None:
    """The fused layers of a decoder of ``cfg`` and ``blocks``; None where a layer kind needs
    the per-layer path or the C kernels are not here."""
    if (cfg.qk_norm_mode != "head" or not cfg.pre_norms or cfg.attn_temp
            or cfg.attn_softcap or cfg.attn_sinks or cfg.kv_lora_rank or cfg.norm != "rms"
            or cfg.parallel or cfg.attn_chunk or cfg.qk_l2_norm
            or cfg.act not in ("silu", "gelu_tanh")):  # fmt: skip
        return None
    layers = [_layer(b) for b in blocks]
    if not layers or any(L is None for L in layers):
        return None
    ffn = blocks[0].gate_up.out_features // 2
    fused = FusedLayers(layers, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads,  # type: ignore[arg-type]
                        cfg.head_dim, ffn, cfg.rms_eps, cfg.attn_scale, cfg.act,
                        cfg.residual_scale, ssm_scan.vector_lanes(),
                        cfg.rope_dim if cfg.partial_rope else None, cfg.rope_type == "norm",
                        cfg.attn_out_gate)  # fmt: skip
    return fused if fused.available and kernels.backend() == "c" else None
