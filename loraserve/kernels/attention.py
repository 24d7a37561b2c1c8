"""Batch-invariant softmax attention over the paged KV pool: ``attention.c`` and its fallback.

Every query row attends the keys 0..n-1 of its own sequence (n = the row's position + 1;
with a sliding window only the last ``window`` of them), read from the pool through the
sequence's KV slot list. A row's result depends on that row's query and those keys/values
alone: not on the batch, on how its prompt was chunked, or on which keys came from the
prefix cache, so one-token decode and many-token prefill give the same bits for the same
position. torch's SDPA and matmuls are not (their summation order follows the shapes), hence
the C kernel; the fallback keeps the property by running one query row at a time with
elementwise ops and reductions whose shapes depend only on that row.

Options, each one more fixed per-row operation: logit soft-capping (gemma2), attention
sinks (gpt-oss), and values narrower than the keys read at their own stride (latent
attention, whose values are the first columns of the compressed keys).

The kernel, or the fallback when it cannot be built, is chosen once (``backend()``) with one
log line.
"""

from __future__ import annotations

import ctypes
import logging
import threading

import torch

from loraserve.cbuild import bind

log = logging.getLogger("loraserve.kernels")

_LOCK = threading.Lock()
_CHOSEN: list[ctypes.CDLL | None] = []  # [] until chosen; then [library or None]


def _lib() -> ctypes.CDLL | None:
    if _CHOSEN:
        return _CHOSEN[0]
    with _LOCK:
        if not _CHOSEN:
            p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
            f32 = ctypes.c_float
            args = [p, i64, p, i64, p, i64, i64, p, p, i64, p, p, i32, f32, f32, p, p, i64,
                    i64, i64, i64, i64, ctypes.c_int]  # fmt: skip
            lib = bind({"ls_attention_ex": (args, ctypes.c_int),
                        "ls_attention_f16": (args, ctypes.c_int)})  # fmt: skip
            if lib is not None:
                log.info("attention: C kernel (batch-invariant, fixed reduction order)")
            else:
                log.warning("attention: no C kernel here, using the slower pure-torch path")
            _CHOSEN.append(lib)
        return _CHOSEN[0]


def backend() -> str:
    """``"c"`` or ``"torch"``: which implementation ``attention`` runs (chosen on first call)."""
    return "c" if _lib() is not None else "torch"


def attention(
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
    """Softmax attention of each query row over its sequence's keys -> out [T, H, Dv] float32.

    q: [T, H, D]; k_cache: [S, Hkv, D], v_cache: [S, Hkv, Dv] flat KV slots (H a multiple
    of Hkv; query head h reads KV head h // (H // Hkv)); v_cache may be a view of k_cache
    (latent attention: ``k_cache[..., :Dv]``). slots: [N] long, every sequence's KV slots for
    positions 0, 1, ... in order, concatenated; seq_off: [B + 1] long, sequence b's slots
    are ``slots[seq_off[b]:seq_off[b + 1]]``. row_seq: [T] int32, each row's sequence;
    row_nkeys: [T] int32, the keys it attends (positions 0..n-1). window > 0: only keys
    with ``q_pos - k_pos < window`` (q_pos = n - 1). Each score is ``scale * q.k``, then
    ``softcap * tanh(score / softcap)`` when softcap > 0. sinks: [H] float32, query head
    h's sink logit, which joins the softmax's max and denominator and adds no value. Raises
    ValueError on inconsistent metadata (a key count past its sequence's slots, a slot
    outside the pool).
    """
    args = (q, k_cache, v_cache, slots, seq_off, row_seq, row_nkeys, scale, window, softcap,
            sinks)  # fmt: skip
    f16 = k_cache.dtype == v_cache.dtype == torch.float16
    if _lib() is None or not (f16 or k_cache.dtype == v_cache.dtype == torch.float32):
        if f16:
            from loraserve.kernels.attention_f16 import attention_f16_torch

            return attention_f16_torch(*args)
        return attention_torch(*args)
    return attention_c(*args)


def attention_c(
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
    """``attention`` by the C kernel; raises RuntimeError without one. A float32 pool runs
    the fixed-order softmax, an float16 pool llama.cpp's f16 numerics (``attention_f16.h``)."""
    lib = _lib()
    if lib is None:
        raise RuntimeError("the attention C kernel is not available here")
    t, h, d = q.shape
    q = q.float()  # [T, H, D]: any row stride, heads contiguous
    if q.stride(2) != 1 or (h > 1 and q.stride(1) != d) or t == 0:
        q = q.contiguous()
    kc, vc = _rows(k_cache), _rows(v_cache)  # [S, Hkv, D], [S, Hkv, Dv] float32
    f16 = kc.dtype == vc.dtype == torch.float16
    if not (f16 or kc.dtype == vc.dtype == torch.float32) or kc.shape[:2] != vc.shape[:2]:
        raise ValueError(
            "the KV pool must be two float32 (or two float16) tensors [S, Hkv, D], [S, Hkv, Dv]"
        )
    if kc.shape[2] != d:
        raise ValueError(f"head_dim {d} of q differs from the pool's {kc.shape[2]}")
    sk = _sinks(sinks, h)
    slots, seq_off = slots.long().contiguous(), seq_off.long().contiguous()  # [N], [B + 1]
    row_seq = row_seq.to(torch.int32).contiguous()  # [T]
    row_nkeys = row_nkeys.to(torch.int32).contiguous()  # [T]
    if row_seq.numel() != t or row_nkeys.numel() != t or seq_off.numel() < 1:
        raise ValueError("row_seq and row_nkeys need one entry per query row")
    dv = vc.shape[2]
    out = torch.empty(t, h, dv, dtype=torch.float32)  # [T, H, Dv]
    fn = lib.ls_attention_f16 if f16 else lib.ls_attention_ex
    rc = fn(
        q.data_ptr(), q.stride(0), kc.data_ptr(), kc.stride(0), vc.data_ptr(), vc.stride(0),
        kc.shape[0], slots.data_ptr(), seq_off.data_ptr(), seq_off.numel() - 1,
        row_seq.data_ptr(), row_nkeys.data_ptr(), int(window), float(scale), float(softcap),
        None if sk is None else sk.data_ptr(), out.data_ptr(), t, h, kc.shape[1], d, dv,
        torch.get_num_threads(),
    )  # fmt: skip
    if rc == -2:
        raise MemoryError("attention: out of memory for the score buffers")
    if rc != 0:
        raise ValueError("attention: inconsistent metadata (key counts, slots or head counts)")
    return out


def attention_torch(
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
    """``attention`` in pure torch, one query row at a time (slow, row-independent too).

    Every op of a row sees contiguous tensors shaped by that row's key count alone (a
    contiguous copy of its keys out of its sequence's gathered ones), and reductions run
    over the last dim only, so the row's bits cannot depend on the other rows.
    """
    t, h, d = q.shape
    s, hkv, dv = k_cache.shape[0], k_cache.shape[1], v_cache.shape[2]
    if hkv < 1 or h % hkv != 0 or k_cache.shape[2] != d or v_cache.shape[:2] != (s, hkv):
        raise ValueError("attention: inconsistent head counts or shapes")
    sk = _sinks(sinks, h)
    sk = None if sk is None else sk.unsqueeze(1)  # [H, 1]
    offs, seqs, counts = seq_off.tolist(), row_seq.tolist(), row_nkeys.tolist()
    if len(seqs) != t or len(counts) != t:
        raise ValueError("row_seq and row_nkeys need one entry per query row")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= s):
        raise ValueError("attention: a KV slot lies outside the pool")
    group = h // hkv
    out = torch.empty(t, h, dv, dtype=torch.float32)  # [T, H, Dv]
    gathered: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for r in range(t):
        b, n = seqs[r], counts[r]
        if not (0 <= b < len(offs) - 1 and 1 <= n <= offs[b + 1] - offs[b]):
            raise ValueError("attention: inconsistent metadata (key counts or sequences)")
        if b not in gathered:
            keys = slots[offs[b] : offs[b + 1]]  # [L] the sequence's KV slots, in order
            kb = k_cache.index_select(0, keys).float()  # [L, Hkv, D]
            vb = v_cache.index_select(0, keys).float().permute(1, 2, 0)  # [Hkv, Dv, L]
            gathered[b] = kb, vb
        kb, vb = gathered[b]
        lo = n - window if 0 < window < n else 0
        k = kb[lo:n].unsqueeze(2).contiguous()  # [m, Hkv, 1, D]
        v = vb[:, :, lo:n].unsqueeze(1).contiguous()  # [Hkv, 1, Dv, m]
        qr = q[r].float().reshape(1, hkv, group, d)  # [1, Hkv, G, D]
        sc = (qr * k).sum(-1).reshape(-1, h).t().contiguous() * scale  # [H, m]
        if softcap > 0.0:
            sc = softcap * torch.tanh(sc * (1.0 / softcap))
        mx = sc.amax(-1, keepdim=True)  # [H, 1]
        if sk is not None:
            mx = torch.maximum(mx, sk)
        p = (sc - mx).exp()  # [H, m]
        den = p.sum(-1, keepdim=True)  # [H, 1]
        if sk is not None:
            den = den + (sk - mx).exp()
        o = (p.view(hkv, group, 1, -1) * v).sum(-1)  # [Hkv, G, Dv, m] -> [Hkv, G, Dv]
        out[r] = o.reshape(h, dv) / den
    return out


def _rows(cache: torch.Tensor) -> torch.Tensor:
    """A pool [S, Hkv, D] whose slots may be strided (a view of a wider pool) but whose heads
    are contiguous within a slot; anything else is copied."""
    if cache.stride(2) == 1 and (cache.shape[1] == 1 or cache.stride(1) == cache.shape[2]):
        return cache
    return cache.contiguous()


def _sinks(sinks: torch.Tensor | None, h: int) -> torch.Tensor | None:
    if sinks is None:
        return None
    sk = sinks.float().contiguous().reshape(-1)  # [H]
    if sk.numel() != h:
        raise ValueError(f"attention: {sk.numel()} sinks for {h} query heads")
    return sk
