"""Which decoders run a step's layers in one C call (`kernels.layers.FusedLayers`), and the
layer specs that call is built from: dense layers whose mixer is attention (plain, gated:
qwen35's output gates, per-head q/k norms, a partial rope), a Mamba-2 (granitehybrid, mamba2,
nemotron-h), gated delta-net (qwen35, qwen3next) or short-convolution (lfm2) mixer, or none
(nemotron-h's FFN layers), or attention and a Mamba-2 mixer side by side (falcon-h1), and
whose FFN is gated, relu(up)^2 without a gate (nemotron-h) or absent (mamba2, nemotron-h's
mixer layers); every projection quantized. Anything else (MoE, float weights, sinks,
soft-capping, ...) keeps the per-layer path."""

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
from loraserve.model.recurrent.shortconv import ShortConv

__all__ = ["build_fused"]

_GATED_ACTS = ("silu", "gelu_tanh")  # the C call's gated activations (`rowops.ACTS`)


def _proj(p: Projection) -> ProjSpec | None:
    if p._qparts is None or not all(m.quantized for m in p.parts) or len(p.parts) > 8:
        return None
    return ProjSpec(p._qparts.parts, p.out_features, p.bias, tuple(n for n, _, _ in p.spans))


def _ffn(cfg: ModelConfig, b: Block) -> tuple[bool, bool] | None:
    """(has an FFN, relu(up)^2 without a gate) of block b, or None where the C call has no
    such FFN (MoE, starcoder2's act(up) alone, an activation it lacks)."""
    if b.moe is not None:
        return None
    if not b.has_ffn:
        return False, False
    if b.plain_ffn:
        return (True, True) if cfg.act == "relu_sqr" else None
    return (True, False) if cfg.act in _GATED_ACTS else None


def _layer(cfg: ModelConfig, b: Block) -> LayerSpec | None:
    """Block b as the fused call's layer, or None where it needs the per-layer path."""
    mix = b.mixer  # attention, a recurrent mixer in its place, or none (the FFN alone)
    gdn = mix.fused_spec() if isinstance(mix, GatedDeltaNet) else None
    ffn = _ffn(cfg, b)
    if isinstance(mix, Mamba2) and mix.fused_spec() is None:  # the chunked form
        return None
    if ffn is None or (b.beside and not isinstance(mix, Mamba2)) \
            or (b.ffn_alone and cfg.residual_scale != 1.0) \
            or not (mix is None or isinstance(mix, (Mamba2, ShortConv)) or gdn is not None) \
            or (not b.rope and b.qk_norm is not None):  # fmt: skip
        return None
    if b.ffn_alone:
        mixes: tuple[Projection, ...] = ()
    elif mix is None or b.beside:
        mixes = (b.qkv, b.o)
    else:
        mixes = (mix.in_proj, mix.out_proj)  # type: ignore[union-attr]
    side = (mix.in_proj, mix.out_proj) if b.beside else ()  # type: ignore[union-attr]
    ffns = (b.gate_up, b.down) if ffn[0] else ()
    projs = [_proj(p) for p in (*mixes, *ffns, *side)]
    if any(p is None for p in projs):
        return None
    qkv, o = projs[:2] if mixes else (None, None)
    gate_up, down = projs[len(mixes) : len(mixes) + 2] if ffns else (None, None)
    ssm_in, ssm_out = projs[-2:] if side else (None, None)
    # the FFN alone reads the layer's attn_norm (block.py's ffn_alone)
    ffn_norm = b.attn_norm if b.ffn_alone else b.ffn_norm if ffn[0] else None
    return LayerSpec(qkv, o, gate_up, down, b.attn_norm.contiguous(), b.qk_norm,
                     _f32(b.post_attn_norm), _f32(ffn_norm), _f32(b.post_ffn_norm),
                     bool(b.sliding), bool(b.rope),
                     mix.fused_spec() if isinstance(mix, Mamba2) else None, gdn,
                     mix.fused_spec() if isinstance(mix, ShortConv) else None,
                     ffn[1], ssm_in, ssm_out)  # fmt: skip


def build_fused(cfg: ModelConfig, blocks: Sequence[Block]) -> FusedLayers | None:
    """The fused layers of a decoder of ``cfg`` and ``blocks``; None where a layer kind needs
    the per-layer path or the C kernels are not here."""
    if (cfg.qk_norm_mode != "head" or not cfg.pre_norms or (cfg.attn_temp and not cfg.attn_temp_all)
            or cfg.attn_softcap or cfg.attn_sinks or cfg.kv_lora_rank or cfg.norm != "rms"
            or cfg.parallel or cfg.attn_chunk or cfg.qk_l2_norm
            or cfg.act not in (*_GATED_ACTS, "relu_sqr")):  # fmt: skip
        return None
    layers = [_layer(cfg, b) for b in blocks]
    if not layers or any(L is None for L in layers):
        return None
    ups = [L.gate_up.n_out // (1 if L.relu_sqr else 2)
           for L in layers if L is not None and L.gate_up is not None]  # fmt: skip
    fused = FusedLayers(layers, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads,  # type: ignore[arg-type]
                        cfg.head_dim, ups[0] if ups else 1, cfg.rms_eps, cfg.attn_scale,
                        cfg.act, cfg.residual_scale, ssm_scan.vector_lanes(),
                        cfg.rope_dim if cfg.partial_rope else None, cfg.rope_type == "norm",
                        cfg.attn_out_gate)  # fmt: skip
    return fused if fused.available and kernels.backend() == "c" else None
