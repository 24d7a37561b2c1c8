"""The pure-torch fallback of attention over an f16 KV pool (``attention_f16.h``): llama.cpp's
f16 numerics, one query vector at a time (q rounded to fp16, an online softmax over the keys
in position order with an fp16 value accumulator). Slow; row-independent by construction."""

from __future__ import annotations

import math

import torch


def attention_f16_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    seq_off: torch.Tensor,
    row_seq: torch.Tensor,
    row_nkeys: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``kernels.attention.attention`` for float16 pools k_cache [S, Hkv, D], v_cache
    [S, Hkv, Dv] -> out [T, H, Dv] float32."""
    t, h, d = q.shape
    hkv, dv = k_cache.shape[1], v_cache.shape[2]
    if hkv < 1 or h % hkv or k_cache.shape[2] != d or v_cache.shape[:2] != k_cache.shape[:2]:
        raise ValueError("attention: inconsistent head counts or shapes")
    group = h // hkv
    offs, seqs, counts = seq_off.tolist(), row_seq.tolist(), row_nkeys.tolist()
    if len(seqs) != t or len(counts) != t:
        raise ValueError("row_seq and row_nkeys need one entry per query row")
    f32 = torch.float32
    sc = scale / softcap if softcap > 0.0 else scale
    sc_t = torch.tensor(sc, dtype=f32)
    out = torch.empty(t, h, dv, dtype=f32)  # [T, H, Dv]
    for r in range(t):
        b, n = seqs[r], counts[r]
        if not (0 <= b < len(offs) - 1 and 1 <= n <= offs[b + 1] - offs[b]):
            raise ValueError("attention: inconsistent metadata (key counts or sequences)")
        lo = n - window if 0 < window < n else 0
        keys = slots[offs[b] : offs[b] + n].long()
        kb = k_cache.index_select(0, keys).float()  # [n, Hkv, D]
        vb = v_cache.index_select(0, keys)  # [n, Hkv, Dv] float16
        for hh in range(h):
            qh = q[r, hh].half().float()  # [D]
            m_, s_ = -math.inf, torch.tensor(0.0, dtype=f32)
            acc = torch.zeros(dv, dtype=f32)
            for j in range(lo, n):
                s = (qh * kb[j, hh // group]).sum() * sc_t
                if softcap > 0.0:
                    s = torch.tanh(s) * softcap
                sv = float(s)
                ms = vs = torch.tensor(1.0, dtype=f32)
                if sv > m_:
                    ms = torch.exp(torch.tensor(m_ - sv, dtype=f32))
                    m_ = sv
                    acc = (acc * ms).half().float()
                else:
                    vs = torch.exp(s - m_)
                acc = torch.addcmul(acc, vb[j, hh // group].float(), vs).half().float()
                s_ = s_ * ms + vs
            if sinks is not None:
                sk = float(sinks.reshape(-1)[hh])
                if sk > m_:
                    ms = torch.exp(torch.tensor(m_ - sk, dtype=f32))
                    acc = acc * ms
                    s_ = s_ * ms + 1.0
                else:
                    s_ = s_ + torch.exp(torch.tensor(sk - m_, dtype=f32))
            inv = torch.tensor(0.0) if float(s_) == 0.0 else 1.0 / s_
            out[r, hh] = acc * inv
    return out
