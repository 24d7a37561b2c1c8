"""Attention over an f16 KV pool (loraserve/kernels/attention_f16.h and its torch fallback):
llama.cpp's f16 numerics, checked against an independent numpy transcription of ggm-cpu's
flash-attention row loop (ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk with K
and V in F16), and row-independent (a row alone gives the bits it gives in any batch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loraserve.kernels.attention import attention_c, backend
from loraserve.kernels.attention_f16 import attention_f16_torch

S = 64


def ggml_row(q, k, v, scale, softcap=0.0, sink=None, lo=0):  # noqa: ANN001, ANN201
    """One query vector as ggml does it: q [D] f32, k [n, D] / v [n, Dv] fp16 -> [Dv]."""
    f32 = np.float32
    qh = q.astype(np.float16).astype(np.float64)
    sc = f32(scale / softcap) if softcap > 0 else f32(scale)
    m, s_sum = -np.inf, f32(0)
    acc = np.zeros(v.shape[1], dtype=np.float16)
    for j in range(lo, k.shape[0]):
        s = f32(f32(qh @ k[j].astype(np.float64)) * sc)
        if softcap > 0:
            s = f32(f32(softcap) * f32(np.tanh(s)))
        ms, vs = f32(1), f32(1)
        if s > m:
            ms = f32(np.exp(f32(m - s))) if m != -np.inf else f32(0)
            m = s
            acc = (acc.astype(f32) * ms).astype(np.float16)
        else:
            vs = f32(np.exp(f32(s - m)))
        acc = (acc.astype(f32) + v[j].astype(f32) * vs).astype(np.float16)
        s_sum = f32(s_sum * ms + vs)
    out = acc.astype(f32)
    if sink is not None:
        if sink > m:
            ms = f32(np.exp(f32(m - sink)))
            out = out * ms
            s_sum = f32(s_sum * ms + 1)
        else:
            s_sum = f32(s_sum + np.exp(f32(sink - m)))
    return out * f32(1 / s_sum)


IMPLS = [
    pytest.param(attention_c, id="c", marks=pytest.mark.skipif(backend() != "c", reason="no cc")),
    pytest.param(attention_f16_torch, id="torch"),
]


def _case(seed: int, hkv: int = 2, group: int = 2, d: int = 64):  # noqa: ANN202
    g = torch.Generator().manual_seed(seed)
    kc = (torch.randn(S, hkv, d, generator=g) * 2).half()  # [S, Hkv, D]
    vc = (torch.randn(S, hkv, d, generator=g) * 2).half()
    slots = torch.randperm(S, generator=g)[:40]
    q = torch.randn(6, hkv * group, d, generator=g) * 2  # [T, H, D]
    return q, kc, vc, slots


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("opts", [{}, {"window": 7}, {"softcap": 5.0}, {"sinks": True}])
def test_f16_attention_equals_ggml_row_loop(impl, opts) -> None:  # noqa: ANN001
    q, kc, vc, slots = _case(1)
    t, h, d = q.shape
    nkeys = torch.tensor([1, 2, 9, 17, 33, 40], dtype=torch.int32)
    sinks = torch.randn(h) if opts.get("sinks") else None
    window, softcap = opts.get("window", 0), opts.get("softcap", 0.0)
    out = impl(q, kc, vc, slots, torch.tensor([0, 40]), torch.zeros(t, dtype=torch.int32),
               nkeys, 0.125, window, softcap, sinks)  # fmt: skip
    ks, vs = kc[slots].numpy(), vc[slots].numpy()  # [40, Hkv, D] fp16
    for r in range(t):
        n = int(nkeys[r])
        lo = n - window if 0 < window < n else 0
        for hh in range(h):
            sk = None if sinks is None else np.float32(sinks[hh])
            want = ggml_row(q[r, hh].numpy(), ks[:n, hh // 2], vs[:n, hh // 2], 0.125, softcap,
                            sk, lo)  # fmt: skip
            # the dot products' summation order is ours: an fp16 rounding may land one
            # step apart where a score differs in its last bit
            np.testing.assert_allclose(out[r, hh].numpy(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.skipif(backend() != "c", reason="no cc")
def test_f16_attention_rows_are_independent_of_the_batch() -> None:
    q, kc, vc, slots = _case(2)
    t = q.shape[0]
    off = torch.tensor([0, 40])
    nkeys = torch.tensor([5, 11, 12, 30, 39, 40], dtype=torch.int32)
    seq = torch.zeros(t, dtype=torch.int32)
    batched = attention_c(q, kc, vc, slots, off, seq, nkeys, 0.125)
    for r in range(t):
        alone = attention_c(q[r : r + 1], kc, vc, slots, off, seq[:1], nkeys[r : r + 1], 0.125)
        assert torch.equal(alone[0], batched[r])
    # the pool's f32 path gives other numbers: the f16 numerics are really in use
    f32 = attention_c(q, kc.float(), vc.float(), slots, off, seq, nkeys, 0.125)
    assert not torch.equal(f32, batched)
