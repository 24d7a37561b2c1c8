"""Attention over the paged KV pool.

Each layer writes the step's new keys/values into its flat KV tensors at
``ctx.slot_mapping`` and then, per attention group, gathers the keys of the group's
sequences by their block tables (``kv_index``) and runs one masked SDPA call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loraserve.model.context import StepContext


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx: StepContext,
    scale: float,
    sliding: bool,
) -> torch.Tensor:
    """q: [T, H, D], k/v: [T, Hkv, D]; caches: [S, Hkv, D] flat slots -> out [T, H, D]."""
    k_cache.index_copy_(0, ctx.slot_mapping, k.to(k_cache.dtype))
    v_cache.index_copy_(0, ctx.slot_mapping, v.to(v_cache.dtype))
    n_heads, head_dim = q.shape[1], q.shape[2]
    gqa = n_heads != k.shape[1]
    if len(ctx.groups) == 1 and ctx.groups[0].rows is None:
        out = None  # single group covering the whole batch: write in place
    else:
        out = torch.empty_like(q)
    for g in ctx.groups:
        qg = q[g.start : g.end] if g.rows is None else q.index_select(0, g.rows)
        b = g.n_seqs
        qg = qg.reshape(b, -1, n_heads, head_dim).transpose(1, 2)  # [B, H, Q, D]
        # index_select over the flat slots: 3.6x faster than advanced indexing here
        flat, shape = g.kv_index.view(-1), (*g.kv_index.shape, *k_cache.shape[1:])
        kg = k_cache.index_select(0, flat).view(shape).transpose(1, 2).to(q.dtype)
        vg = v_cache.index_select(0, flat).view(shape).transpose(1, 2).to(q.dtype)  # [B, Hkv, L, D]
        mask = g.mask_swa if (sliding and g.mask_swa is not None) else g.mask_full
        o = F.scaled_dot_product_attention(
            qg, kg, vg, attn_mask=mask, scale=scale, enable_gqa=gqa
        )  # [B, H, Q, D]
        o = o.transpose(1, 2).reshape(-1, n_heads, head_dim)
        if out is None:
            return o
        if g.rows is None:
            out[g.start : g.end] = o
        else:
            out.index_copy_(0, g.rows, o)
    return out
