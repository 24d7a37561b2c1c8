"""The generic decoder: one class for every architecture in `archs/`.

Weights come from a `WeightSource` under GGUF names (q/k rows of "norm"-rope architectures
already un-permuted to Hugging Face layout), matrices in the precision declared at load.
Architecture differences are fields of `ModelConfig`: flags, and which layer kind (`attn/`,
`ffn/`) sits at which depth.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from loraserve import kernels
from loraserve.kernels.layers import FusedLayers, LayerSpec, ProjSpec
from loraserve.kernels.rowops import layer_norm, softcap_
from loraserve.model.attn import paged_attention
from loraserve.model.attn.mla import LatentAttention
from loraserve.model.attn.rope_scaling import RopeScaling, ScaledRope
from loraserve.model.attn.variants import partial_rope, temperature
from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.ffn import MoE
from loraserve.model.layers import Rope, RowEmbedding, apply_rope, gated_act, rms_norm
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
            parts = [_matrix(w, p + n + ".weight") for n in stems]
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
            _req(w, p + cfg.tensor("attn_norm") + ".weight").float() if cfg.pre_norms else None
        )
        self.attn_norm_b = _f32(w.float(p + cfg.tensor("attn_norm") + ".bias"))  # LayerNorm's
        self.rope = cfg.rope_layers[i]
        self.sinks = _req(w, p + "attn_sinks.weight").float() if cfg.attn_sinks else None
        self.qk_norm = None  # [n_heads + n_kv_heads, head_dim]: q's norm, then k's, per head
        self.qk_full: tuple[torch.Tensor, torch.Tensor] | None = None  # [nq D], [nkv D]
        attn = self.mixer is None  # q/k norms belong to attention layers
        if attn and cfg.qk_norm and cfg.qk_norm_mode == "full":
            self.qk_full = (_req(w, p + "attn_q_norm.weight"), _req(w, p + "attn_k_norm.weight"))
        elif attn and (
            cfg.qk_norm
            or (cfg.qk_norm_mode == "head_if_present" and w.has(p + "attn_q_norm.weight"))
        ):
            qn, kn = _req(w, p + "attn_q_norm.weight"), _req(w, p + "attn_k_norm.weight")
            self.qk_norm = torch.cat(
                (qn.expand(cfg.n_heads, -1), kn.expand(cfg.n_kv_heads, -1))
            ).contiguous()
        self.post_attn_norm = _req(w, p + "post_attention_norm.weight") if cfg.post_norms else None
        self.ffn_norm = (  # none when parallel: the FFN reads the attention's input norm
            None
            if cfg.parallel or not cfg.pre_norms or not cfg.ffn_layers[i] or self.ffn_alone
            else _req(w, _named(w, p + cfg.ffn_norm_name)).float()
        )
        self.ffn_norm_b = _f32(w.float(p + cfg.ffn_norm_name + ".bias"))
        self.post_ffn_norm = _req(w, p + "post_ffw_norm.weight") if cfg.post_norms else None
        self.sliding = cfg.sliding_window > 0 and cfg.sliding_layers[i]
        self.chunk = cfg.attn_chunk if cfg.sliding_layers[i] else 0  # llama4's chunked layers
        self.local_rope = self.sliding or self.chunk > 0  # the local rope base (if any)
        self.has_ffn = cfg.ffn_layers[i]  # none: the mixer and its residual alone (mamba2)
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
            gate = qg[:, :, d:].reshape(t, nq * d)  # [T, nq d]
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
        if not self.rope and cfg.attn_temp:  # llama4: q times the position's temperature
            q = q * temperature(ctx.attn.row_nkeys.long() - 1, cfg.attn_temp)
        k_cache, v_cache = ctx.kv_caches[self.i]
        a = paged_attention(q, k, v, k_cache, v_cache, ctx, cfg.attn_scale, self.sliding,
                            cfg.attn_softcap, self.sinks, self.chunk)  # fmt: skip
        a = a.reshape(t, nq * d)
        if gate is not None:  # sigmoid in float64, rounded: the same bits in any batch
            a = a * torch.sigmoid(gate.double()).float()
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
        rs = self.cfg.residual_scale
        return a if rs == 1.0 else a * torch.tensor(rs, dtype=torch.float32)

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


class Decoder(nn.Module):
    """Token ids and positions of a flat batch -> logits of the rows the step asks for."""

    def __init__(self, cfg: ModelConfig, w: WeightSource) -> None:
        super().__init__()
        self.cfg = cfg
        rows = w.embedding_rows()
        if rows is not None:  # rows dequantized on lookup: no float copy of the vocabulary
            self.embed: torch.Tensor | RowEmbedding = RowEmbedding(
                rows[0], rows[1], cfg.hidden_size
            )
        else:
            self.embed = _req(w, "token_embd.weight")  # [V, hidden] float32
        self.blocks = nn.ModuleList(Block(cfg, i, w) for i in range(cfg.n_layers))
        out_norm = cfg.tensor("output_norm")  # lfm2: token_embd_norm
        self.norm = _req(w, out_norm + ".weight").float()
        self.norm_b = _f32(w.float(out_norm + ".bias"))  # LayerNorm bias (starcoder2)
        if not cfg.tied_output:
            out = _matrix(w, "output.weight")
        elif isinstance(self.embed, torch.Tensor):
            out = Matrix.from_float("output.weight", self.embed)
        else:
            out = _matrix(w, "token_embd.weight", "output.weight")
        self.output = Projection("output.weight", [out])
        # steps run every layer in one C call (`kernels.layers`), LoRA included, same bits
        self.use_fused = True
        self._fused_built: list[FusedLayers | None] = []
        # frequency factors: rope_freqs (llama 3, llama4), else phi3's short ones, or its long
        # ones for a context past the trained one (`for_context`)
        rf = cfg.tensor("rope_freqs")  # "": the file's rope_freqs is unused (falcon-h1)
        self._factors = w.float(rf + ".weight") if rf else None
        self._factors_long = None
        if self._factors is None:
            self._factors = w.float("rope_factors_short.weight")
            self._factors_long = w.float("rope_factors_long.weight")
        self._build_rope(self._factors)
        self._by_long: dict[bool, Decoder] = {False: self}  # `for_context`: shared by siblings

    def _build_rope(self, factors: torch.Tensor | None) -> None:
        cfg = self.cfg
        n = min(cfg.context_length, 8192)
        rd = cfg.rope_dim or cfg.head_dim  # latent attention rotates its rope part only
        rs = cfg.rope_scaling
        local = rs if cfg.local_rope_scaled else rs.unscaled()
        self.rope_global = _rope(rd, cfg.rope_theta, n, factors, rs)
        self.rope_local = (
            _rope(rd, cfg.rope_theta_local, n, factors, local)
            if cfg.rope_theta_local != cfg.rope_theta or local != rs
            else self.rope_global
        )

    def for_context(self, n_ctx_seq: int) -> Decoder:
        """This decoder for sequences of ``n_ctx_seq`` positions. Past the trained context
        (``rope.scaling.original_context_length``), phi3's long rope factors replace the short
        ones, as llama.cpp's ``get_rope_factors`` chooses them for the whole context. The
        choice belongs to the decoder returned: a sibling that shares every layer and weight
        and has its own rope tables, so engines of different contexts over one loaded model
        (router presets) never change each other's; this decoder keeps its own factors."""
        if self._factors_long is None:
            return self
        long = n_ctx_seq > (self.cfg.rope_scaling.ctx_orig or self.cfg.context_length)
        sib = self._by_long.get(long)
        if sib is None:
            sib = copy.copy(self)  # shallow: the same blocks, embedding and output
            sib._modules = dict(self._modules)  # its own entries for the rope modules
            sib._parameters, sib._buffers = dict(self._parameters), dict(self._buffers)
            sib._build_rope(self._factors_long if long else self._factors)
            self._by_long[long] = sib
        return sib

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [T] long -> logits [S, V] float32 for ctx.logits_rows."""
        ctx = get_context()
        max_pos = int(positions.max())
        self.rope_global.ensure(max_pos)
        self.rope_local.ensure(max_pos)
        if isinstance(self.embed, torch.Tensor):
            x = self.embed[input_ids]  # [T, hidden]
        else:
            x = self.embed(input_ids)
        if self.cfg.embed_scale != 1.0:
            x = x * torch.tensor(self.cfg.embed_scale, dtype=torch.float32)
        rope_global = self.rope_global.tables(positions)
        rope_local = self.rope_local.tables(positions)
        fused = self._fused() if self.use_fused else None
        kv = ctx.kv_caches
        lora_in = None
        if fused is not None and ctx.lora is not None:  # deltas in the same call, if it can
            get = getattr(ctx.lora, "fused_inputs", None)
            lora_in = None if get is None else get(fused, x.shape[0])
            if lora_in is None:
                fused = None
        if fused is not None and all(k.dtype == v.dtype == torch.float32 for k, v in kv):
            a = ctx.attn  # every layer in one C call: the same kernels, the same bits
            x = fused(x.contiguous(), ctx.slot_mapping, a.slots, a.seq_off, a.row_seq,
                      a.row_nkeys, a.window, rope_global, rope_local, kv, lora_in)  # fmt: skip
        else:
            none = None
            for blk in self.blocks:
                if not blk.rope:  # identity tables: x * 1 - y * 0 is x, bit for bit
                    if none is None:
                        c = rope_global[0]
                        none = (torch.ones_like(c), torch.zeros_like(c))
                    x = blk(x, none)
                else:
                    x = blk(x, rope_local if blk.local_rope else rope_global)
        cfg = self.cfg
        if ctx.hidden_rows is not None:  # embeddings hook: see StepContext.hidden_rows
            ctx.hidden = norm(cfg, x.index_select(0, ctx.hidden_rows), self.norm, self.norm_b)
        x = norm(cfg, x.index_select(0, ctx.logits_rows), self.norm, self.norm_b)
        logits = self.output(x)  # [S, V]
        if cfg.final_softcap > 0.0:
            softcap_(logits, cfg.final_softcap)
        if cfg.logit_scale != 1.0:  # one multiply per value: the same bits anywhere
            logits.mul_(cfg.logit_scale)
        return logits

    def _fused(self) -> FusedLayers | None:
        """The fused layers, built on first use; None where a layer needs the Python path
        (MoE, float weights) or the C kernels are not here."""
        if not self._fused_built:
            self._fused_built.append(_build_fused(self))
        return self._fused_built[0]


def _build_fused(d: Decoder) -> FusedLayers | None:
    cfg = d.cfg
    if (cfg.residual_scale != 1.0 or cfg.qk_norm_mode != "head" or not cfg.pre_norms
            or cfg.attn_softcap or cfg.attn_sinks or cfg.kv_lora_rank or cfg.norm != "rms"
            or cfg.recurrent or cfg.parallel or not all(cfg.rope_layers) or cfg.partial_rope
            or cfg.attn_chunk or cfg.qk_l2_norm or cfg.attn_out_gate
            or cfg.act not in ("silu", "gelu_tanh")):  # fmt: skip
        return None  # layer kinds the fused C layers do not have: the per-layer path

    def spec(p: Projection) -> ProjSpec | None:
        if p._qparts is None or not all(m.quantized for m in p.parts) or len(p.parts) > 8:
            return None
        return ProjSpec(p._qparts.parts, p.out_features, p.bias, tuple(n for n, _, _ in p.spans))

    layers = []
    for b in d.blocks:
        if b.moe is not None:
            return None
        projs = [spec(p) for p in (b.qkv, b.o, b.gate_up, b.down)]
        if any(p is None for p in projs):
            return None
        qkv, o, gate_up, down = projs
        layers.append(LayerSpec(qkv, o, gate_up, down, b.attn_norm.contiguous(),
                                b.qk_norm, _f32(b.post_attn_norm), b.ffn_norm.contiguous(),
                                _f32(b.post_ffn_norm), bool(b.sliding)))  # fmt: skip
    if not layers:
        return None
    ffn = d.blocks[0].gate_up.out_features // 2
    fused = FusedLayers(layers, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                        ffn, cfg.rms_eps, cfg.attn_scale, cfg.act)  # fmt: skip
    return fused if fused.available and kernels.backend() == "c" else None


def _rope(dim: int, theta: float, n: int, factors: torch.Tensor | None,
          scaling: RopeScaling) -> Rope:  # fmt: skip
    """The rope tables of one base: plain, or scaled as the file says."""
    if scaling.identity:
        return Rope(dim, theta, n, factors)
    return ScaledRope(dim, theta, n, factors, scaling)


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float().contiguous()


def _req(w: WeightSource, name: str) -> torch.Tensor:
    t = w.float(name)
    if t is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return t


def _matrix(w: WeightSource, name: str, label: str | None = None) -> Matrix:
    m = w.matrix(name, label)
    if m is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return m
