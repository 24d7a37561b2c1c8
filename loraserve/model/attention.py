"""Attention over the paged KV pool.

Each layer writes the step's new keys/values into its flat KV tensors at
``ctx.slot_mapping`` and then, per attention group, gathers the keys of the group's
sequences by their block tables (``kv_index``) and runs one masked SDPA call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loraserve.model.context import AttnGroup, StepContext


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
        swa = sliding and g.mask_swa is not None
        index = g.kv_index_swa if (swa and g.kv_index_swa is not None) else g.kv_index
        # index_select over the flat slots: 3.6x faster than advanced indexing here
        flat, shape = index.view(-1), (*index.shape, *k_cache.shape[1:])
        kg = k_cache.index_select(0, flat).view(shape).transpose(1, 2).to(q.dtype)
        vg = v_cache.index_select(0, flat).view(shape).transpose(1, 2).to(q.dtype)  # [B, Hkv, L, D]
        if g.rows is not None:  # decode: one query per sequence
            o = _decode_attention(qg, kg, vg, _bias(g, swa), scale)  # [B, H, D]
        else:
            mask = g.mask_swa if swa else g.mask_full
            qg = qg.reshape(b, -1, n_heads, head_dim).transpose(1, 2)  # [B, H, Q, D]
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


def _bias(g: AttnGroup, swa: bool) -> torch.Tensor:
    """The group's mask as an additive float mask [B, 1, 1, L] (0 keep, -inf drop)."""
    bias = g.bias.get(swa)
    if bias is None:
        mask = g.mask_swa if swa else g.mask_full
        bias = g.bias[swa] = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
    return bias


def _decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query per sequence: q [B, H, D], k/v [B, Hkv, L, D], bias [B, 1, 1, L].

    Two batched matmuls and a softmax: for a single query this is 1.2x (300 keys) to
    1.8x (1,000 keys) faster than SDPA's flash kernel on CPU (measured).
    """
    b, n_heads, d = q.shape
    n_kv = k.shape[1]
    qg = q.view(b, n_kv, n_heads // n_kv, d)  # query heads grouped by their KV head
    scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(scale).add_(bias)  # [B, Hkv, G, L]
    return torch.matmul(torch.softmax(scores, dim=-1), v).view(b, n_heads, d)
