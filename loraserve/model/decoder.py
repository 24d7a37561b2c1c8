"""The generic decoder: one class for llama (dense and MoE), gemma3, qwen2 and qwen3.

Weights come as a mapping from GGUF tensor names to float tensors in Hugging Face
layout (llama's q/k rows already un-permuted by the loader). Architecture differences
are flags of `ModelConfig`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from loraserve.model.attention import paged_attention
from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.layers import Linear, Rope, RowEmbedding, apply_rope, gated_act, rms_norm
from loraserve.model.moe import MoE

WeightFn = Callable[[str], torch.Tensor | None]  # GGUF name -> float tensor, None if absent


class Block(nn.Module):
    """One transformer layer: attention and (dense or MoE) feed-forward, pre/post norms."""

    def __init__(
        self,
        cfg: ModelConfig,
        i: int,
        w: WeightFn,
        dtype: torch.dtype,
        int8: bool,
        prepared: dict[str, tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        super().__init__()
        self.cfg, self.i = cfg, i
        p = f"blk.{i}."

        def lin(n: str) -> Linear:
            name = p + n + ".weight"
            prep = prepared.get(name) if int8 else None
            return Linear(name, _req(w, name), w(p + n + ".bias"), dtype, int8, prepared=prep)

        self.q, self.k, self.v, self.o = (
            lin("attn_q"),
            lin("attn_k"),
            lin("attn_v"),
            lin("attn_output"),
        )
        self.attn_norm = _req(w, p + "attn_norm.weight").float()
        self.q_norm = w(p + "attn_q_norm.weight") if cfg.qk_norm else None
        self.k_norm = w(p + "attn_k_norm.weight") if cfg.qk_norm else None
        self.post_attn_norm = _req(w, p + "post_attention_norm.weight") if cfg.post_norms else None
        self.ffn_norm = _req(w, p + "ffn_norm.weight").float()
        self.post_ffn_norm = _req(w, p + "post_ffw_norm.weight") if cfg.post_norms else None
        self.sliding = cfg.sliding_window > 0 and cfg.sliding_layers[i]
        if cfg.is_moe:
            self.moe: MoE | None = MoE(cfg, p, w, dtype)
        else:
            self.moe = None
            self.gate, self.up, self.down = lin("ffn_gate"), lin("ffn_up"), lin("ffn_down")

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: [T, hidden]; rope: this layer's (cos, sin) tables for the step's positions."""
        cfg, ctx = self.cfg, get_context()
        eps = cfg.rms_eps
        h = rms_norm(x, self.attn_norm, eps)
        t = h.shape[0]
        q = self.q(h).view(t, cfg.n_heads, cfg.head_dim)
        k = self.k(h).view(t, cfg.n_kv_heads, cfg.head_dim)
        v = self.v(h).view(t, cfg.n_kv_heads, cfg.head_dim)
        if self.q_norm is not None:
            q = rms_norm(q, self.q_norm, eps)
            k = rms_norm(k, self.k_norm, eps)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        k_cache, v_cache = ctx.kv_caches[self.i]
        a = paged_attention(q, k, v, k_cache, v_cache, ctx, cfg.attn_scale, self.sliding)
        a = self.o(a.reshape(t, cfg.n_heads * cfg.head_dim))
        if self.post_attn_norm is not None:
            a = rms_norm(a, self.post_attn_norm, eps)
        x = x + a
        h = rms_norm(x, self.ffn_norm, eps)
        if self.moe is not None:
            f = self.moe(h)
        else:
            f = self.down(gated_act(self.gate(h), self.up(h), cfg.act))
        if self.post_ffn_norm is not None:
            f = rms_norm(f, self.post_ffn_norm, eps)
        return x + f


class Decoder(nn.Module):
    """Token ids and positions of a flat batch -> logits of the rows the step asks for."""

    def __init__(
        self,
        cfg: ModelConfig,
        w: WeightFn,
        dtype: torch.dtype = torch.float32,
        int8: bool = False,
        prepared: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
        embedding: RowEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.cfg, self.dtype = cfg, dtype
        prepared = prepared or {}
        self.embed: torch.Tensor | RowEmbedding = (
            embedding if embedding is not None else _req(w, "token_embd.weight")
        )  # [V, hidden] float32 table, or rows dequantized on lookup
        self.blocks = nn.ModuleList(
            Block(cfg, i, w, dtype, int8, prepared) for i in range(cfg.n_layers)
        )
        self.norm = _req(w, "output_norm.weight").float()
        out_name = "token_embd.weight" if cfg.tied_output else "output.weight"
        out_prep = prepared.get("output.weight") if int8 else None
        if out_prep is not None:
            out_w = None
        elif isinstance(self.embed, torch.Tensor) and cfg.tied_output:
            out_w = self.embed
        else:
            out_w = _req(w, out_name)
        self.output = Linear(
            "output.weight", out_w, None, dtype, int8, keep_float=not int8, prepared=out_prep
        )
        if int8:  # the vocabulary projection dominates a decode step: fastest kernel
            self.output.use_int8_matmul()
        n = min(cfg.context_length, 8192)
        self.rope_global = Rope(cfg.head_dim, cfg.rope_theta, n)
        self.rope_local = (
            Rope(cfg.head_dim, cfg.rope_theta_local, n)
            if cfg.rope_theta_local != cfg.rope_theta
            else self.rope_global
        )

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [T] long -> logits [S, V] float32 for ctx.logits_rows."""
        ctx = get_context()
        max_pos = int(positions.max())
        self.rope_global.ensure(max_pos)
        self.rope_local.ensure(max_pos)
        if isinstance(self.embed, torch.Tensor):
            x = self.embed[input_ids].to(self.dtype)  # [T, hidden]
        else:
            x = self.embed(input_ids).to(self.dtype)
        if self.cfg.embed_scale != 1.0:
            x = x * torch.tensor(self.cfg.embed_scale, dtype=self.dtype)
        rope_global = self.rope_global.tables(positions)
        rope_local = self.rope_local.tables(positions)
        for blk in self.blocks:
            x = blk(x, rope_local if blk.sliding else rope_global)
        x = x.index_select(0, ctx.logits_rows)
        x = rms_norm(x, self.norm, self.cfg.rms_eps)
        return self.output(x).float()


def _req(w: WeightFn, name: str) -> torch.Tensor:
    t = w(name)
    if t is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return t
