"""Multi-head latent attention (deepseek2, llama.cpp src/models/deepseek2.cpp, MLA path) over
a compressed KV cache.

Each token's cache row holds its compressed KV, ``c = RMSNorm(x W_kv_a[:rank])`` (``rank`` =
kv_lora_rank, 512), and its rotated rope key ``k_pe`` (64), shared by every head: 576 floats a
token instead of heads x (192 + 128). Queries absorb the key up-projection (``attn_k_b``): head
h's query is ``[q_nope_h W_k_b[h]^T | rope(q_pe_h)]`` against the cache rows, the values are the
rows' first ``rank`` columns (a view of the same pool, read by the attention kernel at its own
stride), and each head's weighted latent goes through ``attn_v_b[h]`` before the output
projection. This is llama.cpp's absorbed form, whose numbers it computes in the same order.
Each of the two per-head stacks runs for all heads in one grouped call (`heads.HeadStack`),
and the small steps between the projections and the attention kernel (the rope columns'
reorder, the latent's RMSNorm, the rotations, the query rows and the cache write) in one C
call (`kernels.mla`, the same float operations as `_prep_torch`, which runs without it).

Rope on adjacent pairs (llama.cpp's "norm"): the rope columns of ``attn_q_b`` (``attn_q``) and
``attn_kv_a_mqa``'s outputs are taken in halves order (`weights.unpermute_qk`'s order), so that
rotating halves is the same rotation; the weights stay as stored, so adapters on them apply as
they are. Every projection here takes LoRA: the per-head ``attn_k_b`` / ``attn_v_b`` as
``attn_k_b.weight`` (one head) or per head like experts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from loraserve.kernels import mla as mla_kernel
from loraserve.kernels.attention import attention
from loraserve.model.attn.heads import HeadStack
from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.layers import apply_rope, rms_norm
from loraserve.model.projection import Matrix, Projection
from loraserve.model.weights import WeightSource, unpermute_qk


class LatentAttention(nn.Module):
    """deepseek2's attention of layer ``i``: h [T, hidden] -> [T, hidden] (output projected).

    The layer's KV pool is [S, 1, rank + rope_dim] (``cfg.head_dim``, one KV head); its V pool
    is not used.
    """

    def __init__(self, cfg: ModelConfig, i: int, w: WeightSource) -> None:
        super().__init__()
        p = f"blk.{i}."
        self.cfg, self.rank, self.rope_dim = cfg, cfg.kv_lora_rank, cfg.rope_dim
        self.nope, self.dv, h = cfg.qk_nope_dim, cfg.v_head_dim, cfg.n_heads
        qd = self.nope + self.rope_dim
        q_rows = torch.arange(h * qd).view(h, qd)
        q_rows[:, self.nope :] = unpermute_qk(q_rows[:, self.nope :].T.contiguous(), 1).T
        self.q_rows = q_rows.reshape(-1)  # output columns in halves order
        self.q_a: Projection | None = None
        if w.has(p + "attn_q_a.weight"):
            self.q_a = _proj(w, p + "attn_q_a.weight")
            self.q_a_norm = _float(w, p + "attn_q_a_norm.weight")
            self.q = _proj(w, p + "attn_q_b.weight")
        else:
            self.q = _proj(w, p + "attn_q.weight")
        self.kv_rows = torch.arange(self.rank + self.rope_dim)
        self.kv_rows[self.rank :] = unpermute_qk(self.kv_rows[self.rank :], 1)
        self.perm = (self.kv_rows[self.rank :] - self.rank).contiguous()  # [rope]: halves order
        q_perm = q_rows[:, self.nope :] - q_rows[:, :1] - self.nope  # [H, rope]: each head's
        if not torch.equal(q_perm, self.perm.expand(h, -1)):
            raise AssertionError("latent attention: q and kv rope orders differ")
        self.kv_a = _proj(w, p + "attn_kv_a_mqa.weight")  # [rank + rope, hidden]
        self.kv_a_norm = _float(w, p + "attn_kv_a_norm.weight")
        self.k_b = _heads(w, p + "attn_k_b.weight", h)  # H x [rank, nope]
        self.v_b = _heads(w, p + "attn_v_b.weight", h)  # H x [dv, rank]
        # both stacks' heads in one grouped call each (adapter steps: a loop over heads)
        self._k_b = _stack(self.k_b)
        self._v_b = _stack(self.v_b)
        self.o = _proj(w, p + "attn_output.weight")
        self.prefix = p

    def head_shapes(self) -> dict[str, tuple[int, int, int]]:
        """The per-head stacks as adapters address them: name -> (H, out, in), like stacked
        experts (head j's delta as expert j's); a stack stored 2-D (one head) is a
        projection instead."""
        return {
            self.prefix + name + ".weight": (len(m), *m[0].shape)
            for name, m in (("attn_k_b", self.k_b), ("attn_v_b", self.v_b))
            if not isinstance(m, Projection)
        }

    def forward(
        self, h: torch.Tensor, layer: int, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """h: [T, hidden] normed; rope: (cos, sin) [T, rope_dim / 2] -> [T, hidden]."""
        cfg, ctx = self.cfg, get_context()
        t, nh, eps, qd = h.shape[0], cfg.n_heads, cfg.rms_eps, self.nope + self.rope_dim
        if self.q_a is not None:
            q = self.q(rms_norm(self.q_a(h), self.q_a_norm, eps))  # [T, H (nope + rope)]
        else:
            q = self.q(h)
        kv = self.kv_a(h)  # [T, rank + rope], the rope part on adjacent pairs
        kb = self._k_b(q.view(t, nh, qd), ctx.lora)  # [T, H, rank]: k_b absorbed in the query
        k_cache, _ = ctx.kv_caches[layer]
        if t and k_cache.dtype in (torch.float32, torch.float16) and mla_kernel.available():
            qa = mla_kernel.mla_prep(q, kv, kb, self.perm, self.kv_a_norm, eps, *rope,
                                     ctx.slot_mapping, k_cache, qd)  # fmt: skip
        else:
            qa = self._prep_torch(q, kv, kb, rope, ctx.slot_mapping, k_cache)
        a = ctx.attn
        lat = attention(qa, k_cache, k_cache[:, :, : self.rank], a.slots, a.seq_off, a.row_seq,
                        a.row_nkeys, cfg.attn_scale)  # fmt: skip  # [T, H, rank]
        out = self._v_b(lat, ctx.lora).reshape(t, nh * self.dv)  # [T, H dv]
        return self.o(out)

    def _prep_torch(
        self, q: torch.Tensor, kv: torch.Tensor, kb: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor, k_cache: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """`kernels.mla.mla_prep` in tensor operations (the same float operations): the
        query rows [T, H, rank + rope] = [kb | rope(q_pe)], each token's cache row
        [RMSNorm(c) | rope(k_pe)] written at its slot."""
        t, nh, eps = q.shape[0], self.cfg.n_heads, self.cfg.rms_eps
        q = q.index_select(1, self.q_rows).view(t, nh, self.nope + self.rope_dim)
        kv = kv.index_select(1, self.kv_rows)  # [T, rank + rope], rope in halves order
        c = rms_norm(kv[:, : self.rank], self.kv_a_norm, eps)  # [T, rank]
        pe = torch.cat((q[:, :, self.nope :], kv[:, None, self.rank :]), 1)  # [T, H + 1, rope]
        pe = apply_rope(pe.contiguous(), *rope)
        qa = torch.empty(t, nh, self.rank + self.rope_dim)  # [T, H, rank + rope]
        qa[:, :, : self.rank] = kb
        qa[:, :, self.rank :] = pe[:, :nh]
        k = torch.cat((c, pe[:, nh]), 1)  # [T, rank + rope]: the compressed cache row
        k_cache.index_copy_(0, slots, k.unsqueeze(1).to(k_cache.dtype))
        return qa


def _matrix(w: WeightSource, name: str) -> Matrix:
    m = w.matrix(name)
    if m is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return m


def _float(w: WeightSource, name: str) -> torch.Tensor:
    t = w.float(name)
    if t is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return t.float().contiguous()


def _proj(w: WeightSource, name: str) -> Projection:
    return Projection(name, [_matrix(w, name)])


def _heads(w: WeightSource, name: str, n_heads: int) -> list[Matrix] | Projection:
    """A per-head stack [H, out, in] as one matrix per head; stored 2-D (one head), a
    projection."""
    t = w.float(name)
    if t is not None and t.dim() == 2 and n_heads == 1:
        return _proj(w, name)
    ms = w.experts(name) if t is not None else None
    if ms is None or len(ms) != n_heads:
        raise ValueError(f"model file lacks tensor {name!r} with {n_heads} heads")
    return ms


def _stack(m: list[Matrix] | Projection) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """A per-head stack's call on (x [T, H, >= in], the step's LoRA) -> [T, H, out]:
    grouped, or (one head stored 2-D) its projection, which reads the LoRA itself."""
    if not isinstance(m, Projection):
        return HeadStack(m)
    n_in = m.in_features
    return lambda x, _lora: m(x[:, 0, :n_in].contiguous()).unsqueeze(1)
