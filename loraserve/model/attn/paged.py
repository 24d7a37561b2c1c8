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
from loraserve.model.context import AttnMeta, StepContext


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
    chunk: int = 0,
) -> torch.Tensor:
    """q: [T, H, D], k/v: [T, Hkv, D]; caches: [S, Hkv, D] flat slots -> out [T, H, D].

    Sliding-window layers: each row attends only its last ``ctx.attn.window`` keys.
    chunk > 0 (llama4's chunked layers): each row attends only the keys of its own chunk
    (positions ``floor(pos / chunk) * chunk .. pos``).
    The new keys are written first and read back from the pool, exactly as stored.
    softcap > 0 caps the scores (gemma2); sinks [H] join each head's softmax (gpt-oss).
    """
    k_cache.index_copy_(0, ctx.slot_mapping, k.to(k_cache.dtype))
    v_cache.index_copy_(0, ctx.slot_mapping, v.to(v_cache.dtype))
    a = chunked(ctx.attn, chunk) if chunk > 0 else ctx.attn
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


def chunked(a: AttnMeta, chunk: int) -> AttnMeta:
    """The step's attention metadata with every row past its sequence's first chunk moved to a
    sequence of its own chunk's slots (the keys it attends: the same slots in the same order,
    so the same bits as any other batch would give it)."""
    start = (a.row_nkeys.long() - 1) // chunk * chunk  # [T] first position of each row's chunk
    if not bool((start > 0).any()):
        return a
    groups: dict[tuple[int, int], int] = {}
    row_seq = a.row_seq.clone()
    row_nkeys = a.row_nkeys.clone()
    slots, offs = [a.slots], [int(a.slots.numel())]
    n_seq = a.seq_off.numel() - 1
    for t in torch.nonzero(start > 0).flatten().tolist():
        b, s0 = int(a.row_seq[t]), int(start[t])
        key = (b, s0)
        if key not in groups:
            lo, hi = int(a.seq_off[b]) + s0, int(a.seq_off[b + 1])
            slots.append(a.slots[lo:hi])
            offs.append(offs[-1] + hi - lo)
            groups[key] = n_seq + len(groups)
        row_seq[t] = groups[key]
        row_nkeys[t] -= s0
    seq_off = torch.cat((a.seq_off[:-1], torch.tensor(offs, dtype=a.seq_off.dtype)))
    return AttnMeta(torch.cat(slots), seq_off, row_seq, row_nkeys, a.window)
