"""One decoder layer (`Block`): its mixer (attention, latent attention or a recurrent kind from
`recurrent/`, or none), its norms and residuals, and its feed-forward (dense or MoE), as
`ModelConfig` declares them for the layer's depth; and the architecture's input norm (`norm`).
The stack of layers, embedding, output and rope tables is `decoder.Decoder`.
"""

from __future__ import annotations

import torch
from torch import nn

from loraserve.kernels.rowops import layer_norm
from loraserve.kernels.sigmoid_gate import sigmoid_gate
from loraserve.model.attn import paged_attention
from loraserve.model.attn.mla import LatentAttention
from loraserve.model.attn.variants import partial_rope, temperature
from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.ffn import MoE
from loraserve.model.layers import apply_rope, gated_act, rms_norm
from loraserve.model.projection import Matrix, Projection
from loraserve.model.recurrent import build as build_recurrent
from loraserve.model.weights import WeightSource


class Block(nn.Module):
    """One transformer layer: attention and (dense or MoE) feed-forward, pre/post norms."""

    def __init__(self, cfg: ModelConfig, i: int, w: WeightSource) -> None:
        super().__init__()
        self.cfg, self.i = cfg, i
        p = f"blk.{i}."

        def proj(stems: tuple[str, ...], name: str) -> Projection:
            parts = [matrix(w, p + n + ".weight") for n in stems]
            bs = [None if n in cfg.unused_biases else w.float(p + n + ".bias") for n in stems]
            bias = None
            if any(b is not None for b in bs):
                pieces = zip(bs, parts, strict=True)
                bias = torch.cat(
                    [b if b is not None else torch.zeros(m.shape[0]) for b, m in pieces]
                )
            return Projection(p + name + ".weight", parts, bias)

        # q|k|v and gate|up each run as one projection of one input (phi3 stores them fused:
        # attn_qkv, and ffn_up holding gate|up)
        self.mla = LatentAttention(cfg, i, w) if cfg.kv_lora_rank else None  # deepseek2
        self.mixer = build_recurrent(cfg, i, w)  # a recurrent layer in place of attention
        self.beside = cfg.layer_kinds[i].startswith("attn+")  # and attention, summed (falcon-h1)
        self.ffn_alone = cfg.layer_kinds[i] == "ffn"  # the FFN alone on attn_norm (nemotron-h)
        if self.mla is None and (self.mixer is None or self.beside) and not self.ffn_alone:
            qkv = ("attn_qkv",) if w.has(p + "attn_qkv.weight") else ("attn_q", "attn_k", "attn_v")
            self.qkv = proj(qkv, "attn_qkv")
            self.o = proj(("attn_output",), "attn_output")
        self.attn_norm = (  # none: attention reads the residual as is (olmo2)
            req(w, p + cfg.tensor("attn_norm") + ".weight").float() if cfg.pre_norms else None
        )
        self.attn_norm_b = f32(w.float(p + cfg.tensor("attn_norm") + ".bias"))  # LayerNorm's
        self.rope = cfg.rope_layers[i]
        self.sinks = req(w, p + "attn_sinks.weight").float() if cfg.attn_sinks else None
        self.qk_norm = None  # [n_heads + n_kv_heads, head_dim]: q's norm, then k's, per head
        self.qk_full: tuple[torch.Tensor, torch.Tensor] | None = None  # [nq D], [nkv D]
        attn = self.mixer is None  # q/k norms belong to attention layers
        if attn and cfg.qk_norm and cfg.qk_norm_mode == "full":
            self.qk_full = (req(w, p + "attn_q_norm.weight"), req(w, p + "attn_k_norm.weight"))
        elif attn and (
            cfg.qk_norm
            or (cfg.qk_norm_mode == "head_if_present" and w.has(p + "attn_q_norm.weight"))
        ):
            qn, kn = req(w, p + "attn_q_norm.weight"), req(w, p + "attn_k_norm.weight")
            self.qk_norm = torch.cat(
                (qn.expand(cfg.n_heads, -1), kn.expand(cfg.n_kv_heads, -1))
            ).contiguous()
        self.post_attn_norm = req(w, p + "post_attention_norm.weight") if cfg.post_norms else None
        self.ffn_norm = (  # none when parallel: the FFN reads the attention's input norm
            None
            if cfg.parallel or not cfg.pre_norms or not cfg.ffn_layers[i] or self.ffn_alone
            else req(w, _named(w, p + cfg.ffn_norm_name)).float()
        )
        self.ffn_norm_b = f32(w.float(p + cfg.ffn_norm_name + ".bias"))
        self.post_ffn_norm = req(w, p + "post_ffw_norm.weight") if cfg.post_norms else None
        self.sliding = cfg.sliding_window > 0 and cfg.sliding_layers[i]
        self.chunk = cfg.attn_chunk if cfg.sliding_layers[i] else 0  # llama4's chunked layers
        self.local_rope = self.sliding or self.chunk > 0  # the local rope base (if any)
        self.has_ffn = cfg.ffn_layers[i]  # none: the mixer and its residual alone (mamba2)
        rs = cfg.residual_scale  # the branches' scale as a float32 scalar tensor, made once
        self.rs = None if rs == 1.0 else torch.tensor(rs, dtype=torch.float32)
        if cfg.moe_layers[i] and self.has_ffn:
            self.moe: MoE | None = MoE(cfg, p, w)
        elif not self.has_ffn:
            self.moe = None
        else:
            self.moe = None
            fused = not w.has(p + "ffn_gate.weight")
            up_rows = w.shape(p + "ffn_up.weight")[0] if fused else 0
            self.plain_ffn = fused and up_rows == cfg.ffn_dim  # act(up) alone (starcoder2)
            self.gate_up = proj(("ffn_up",) if fused else ("ffn_gate", "ffn_up"), "ffn_gate_up")
            self.down = proj(("ffn_down",), "ffn_down")

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: [T, hidden]; rope: this layer's (cos, sin) tables for the step's positions."""
        cfg, ctx = self.cfg, get_context()
        eps = cfg.rms_eps
        h = norm(cfg, x, self.attn_norm, self.attn_norm_b)
        if self.mla is not None:  # latent attention over the compressed cache (deepseek2)
            return self._residual(x, h, self.mla(h, self.i, rope))
        if self.ffn_alone:
            return x + self._ffn(h)
        if self.mixer is not None and not self.beside:  # recurrent (`model/recurrent/`)
            return self._residual(x, h, self.mixer(h))
        t, nq, nkv, d = h.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qkv = self.qkv(h)  # [T, (nq + 2 nkv) d], or [T, (2 nq + 2 nkv) d] with output gates
        gate = None
        if cfg.attn_out_gate:  # each head's query then its gate (qwen35): split them
            qg = qkv[:, : 2 * nq * d].view(t, nq, 2 * d)
            gate = qg[:, :, d:]  # [T, nq, d] (a view)
            qkv = torch.cat((qg[:, :, :d].reshape(t, nq * d), qkv[:, 2 * nq * d :]), 1)
        qk = qkv[:, : (nq + nkv) * d].view(t, nq + nkv, d)  # q and k heads, normed and
        v = qkv[:, (nq + nkv) * d :].view(t, nkv, d)  # rotated together below
        if self.qk_full is not None:  # each of q and k normed over all its heads at once
            qn = rms_norm(qkv[:, : nq * d].contiguous(), self.qk_full[0], eps)  # [T, nq D]
            kn = rms_norm(qkv[:, nq * d : (nq + nkv) * d].contiguous(), self.qk_full[1], eps)
            qk = torch.cat((qn, kn), 1).view(t, nq + nkv, d)
        after = cfg.qk_norm_mode == "head_after_rope"
        if self.rope and cfg.partial_rope:  # the first rope_dim dims of each head rotated
            if self.qk_norm is not None and not after:
                qk = rms_norm(qk, self.qk_norm, eps)
            qk = partial_rope(qk, *rope, cfg.rope_dim, cfg.rope_type == "norm")
        elif self.rope:  # qk norm (if any, unless after) and rope
            qk = apply_rope(qk, *rope, norm=None if after else self.qk_norm, eps=eps)
        if self.qk_norm is not None and (after or not self.rope):
            qk = rms_norm(qk, self.qk_norm, eps)
        if self.rope and cfg.qk_l2_norm:  # llama4: q and k RMS-normed without weight
            qk = rms_norm(qk, torch.ones(d), eps)
        q, k = qk[:, :nq], qk[:, nq:]
        if cfg.attn_temp and (cfg.attn_temp_all or not self.rope):  # q times its temperature
            q = q * temperature(ctx.attn.row_nkeys.long() - 1, cfg.attn_temp)
        k_cache, v_cache = ctx.kv_caches[self.i]
        a = paged_attention(q, k, v, k_cache, v_cache, ctx, cfg.attn_scale, self.sliding,
                            cfg.attn_softcap, self.sinks, self.chunk)  # fmt: skip
        a = a.reshape(t, nq * d)
        if gate is not None:  # sigmoid in float64, rounded: the same bits in any batch
            a = sigmoid_gate(a, gate)
        a = self.o(a)
        return self._residual(x, h, a + self.mixer(h) if self.beside else a)

    def _residual(self, x: torch.Tensor, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The layer's output from its input x, the attention's normed input h and the
        attention's output a (all [T, hidden]): post-norm, residuals and the FFN."""
        cfg = self.cfg
        if self.post_attn_norm is not None:
            a = rms_norm(a, self.post_attn_norm, cfg.rms_eps)
        if cfg.parallel:  # the FFN reads the attention's input norm
            return x + self._ffn(h) + a
        x = x + self._scaled(a)
        if not self.has_ffn:
            return x
        return x + self._scaled(self._ffn(norm(cfg, x, self.ffn_norm, self.ffn_norm_b)))

    def _scaled(self, a: torch.Tensor) -> torch.Tensor:
        """A branch's output [T, hidden] times the residual scale (granite), else as is."""
        rs = self.rs
        return a if rs is None else a * rs

    def _ffn(self, h: torch.Tensor) -> torch.Tensor:
        """The feed-forward of the normed h [T, hidden] -> [T, hidden], post-norm included."""
        cfg = self.cfg
        if self.moe is not None:
            f = self.moe(h)
        else:
            if self.plain_ffn and cfg.act == "relu_sqr":  # relu(x)^2 (nemotron-h)
                r = torch.relu(self.gate_up(h))
                return self.down(r * r)
            if self.plain_ffn:  # act(x) as act(x) * 1, exactly
                up = self.gate_up(h)
                gate, up = up, torch.ones_like(up)
            else:
                gate, up = self.gate_up(h).chunk(2, dim=-1)
            f = self.down(gated_act(gate, up, cfg.act))
        if self.post_ffn_norm is not None:
            f = rms_norm(f, self.post_ffn_norm, cfg.rms_eps)
        return f


def _named(w: WeightSource, stem: str) -> str:
    """``stem.weight``, or the bare ``stem`` where the file names it so (falcon-h1's ffn_norm)."""
    return stem + ".weight" if w.has(stem + ".weight") or not w.has(stem) else stem


def norm(
    cfg: ModelConfig, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The architecture's input norm of x [T, hidden]: RMSNorm, or LayerNorm (cohere2); none
    where the architecture has no pre-norms (weight None: olmo2)."""
    if weight is None:
        return x
    if cfg.norm == "layer":
        return layer_norm(x, weight, bias, cfg.rms_eps)
    return rms_norm(x, weight, cfg.rms_eps)


def f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float().contiguous()


def req(w: WeightSource, name: str) -> torch.Tensor:
    t = w.float(name)
    if t is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return t


def matrix(w: WeightSource, name: str, label: str | None = None) -> Matrix:
    m = w.matrix(name, label)
    if m is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return m
