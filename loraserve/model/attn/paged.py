"""Attention over the paged KV pool.

Each layer writes the step's new keys/values into its flat KV tensors at
``ctx.slot_mapping``, then attends every query row of the step, decode rows and prefill
chunks alike, over the pool in one call of the batch-invariant kernel
(``loraserve.kernels.attention``): a row's result depends on its query and the keys it
attends alone, so decode and prefill give the same bits for the same position, whatever
the batch, the chunking or the prefix cache.
"""

from __future__ import annotations

import torch

from loraserve.kernels.attention import attention
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
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [T, H, D], k/v: [T, Hkv, D]; caches: [S, Hkv, D] flat slots -> out [T, H, D].

    Sliding-window layers: each row attends only its last ``ctx.attn.window`` keys.
    The new keys are written first and read back from the pool, exactly as stored.
    softcap > 0 caps the scores (gemma2); sinks [H] join each head's softmax (gpt-oss).
    """
    k_cache.index_copy_(0, ctx.slot_mapping, k.to(k_cache.dtype))
    v_cache.index_copy_(0, ctx.slot_mapping, v.to(v_cache.dtype))
    a = ctx.attn
    out = attention(
        q,
        k_cache,
        v_cache,
        a.slots,
        a.seq_off,
        a.row_seq,
        a.row_nkeys,
        scale,
        a.window if sliding else 0,
        softcap,
        sinks,
    )  # [T, H, D] float32
    return out.to(q.dtype)
