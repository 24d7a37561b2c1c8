"""Gated delta-net linear attention (qwen3next, qwen35, qwen35moe; llama.cpp
``build_layer_attn_linear`` with ``ggml_ssm_conv`` and ``ggml_gated_delta_net``).

Sizes (`ModelConfig.ssm`): d_conv, d_inner (= value heads x S), S (``ssm.state_size``, a key and
a value head's width), H_v (``ssm.time_step_rank``, value heads) and H_k (``ssm.group_count``,
key heads). One projection of the normed input gives ``attn_qkv`` [2 H_k S + H_v S] (q, k, v),
``attn_gate`` z [H_v S] (early qwen3next files: both in one ``ssm_in``, per key head) and the
per-head beta and alpha logits (``ssm_beta``/``ssm_alpha``, or qwen3next's ``ssm_ba``: per key
head its H_v/H_k betas then its alphas). q|k|v goes through the causal depthwise convolution
(``ssm_conv1d`` [conv_dim, d_conv], no bias) and SiLU; q and k are L2-normed per head
(llama.cpp: ``rms_norm(x, eps / S) / sqrt(S)``). Value head h reads key head ``h % H_k``
(qwen35: ggml's repeat tiles) or ``h // (H_v / H_k)`` (qwen3next: its converter's
interleave, told apart by its ``ssm_ba`` layout). Per token, with g = softplus(alpha + ssm_dt)
* ssm_a and beta = sigmoid(beta logit), each value head's state M [S (value), S (key)] runs

    M <- M exp(g);  d = (v - M k) beta;  M <- M + d k^T;  o = (M q) / sqrt(S)

(ggml's CPU op, in that order). o is RMS-normed per head by ``ssm_norm`` [S], times SiLU(z),
and projected by ``ssm_out``.

Row independence: the recurrence runs token by token per sequence, on tensors whose shapes
never depend on the batch, the chunking or where a chunk starts, so a sequence's state and
outputs are the same bits alone, batched, in any prefill chunks and resumed from a snapshot.
(`--scan-form chunked` runs the chunked form for prompt rows instead, and keeps the chunked
records beside the recurrence of decode rows: `chunked.gdn_scan`.) A
sequence's state is one flat tensor: the conv rows, then M of every value head. The
recurrence runs in C (`kernels/deltanet.c`: one call per layer and step, every sequence and
head in parallel) with the float operations of `recur_torch`, the torch reference, bit for
bit; one value head (where torch's bmm sums in another order) and builds without the C
kernels run the reference. The C paths compute the gates value by value in libm
(`kernels.deltanet.gdn_gates`, whatever the layout), and a decode step (one new row per
sequence) runs the whole mixer between its projections in one C call (`gdn_step`: the very
functions of the general path), which the fused C layers (`kernels.layers`) call too; in the
chunked form it also keeps the chunked record (`chunked.gdn_scan`'s bits).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from loraserve.cache.state import SeqStep
from loraserve.kernels import deltanet as kernel
from loraserve.kernels import gdn_chunk
from loraserve.kernels.layers_spec import GdnSpec
from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.layers import gated_act, rms_norm
from loraserve.model.projection import Projection
from loraserve.model.recurrent import chunked
from loraserve.model.recurrent.gdn_math import gate_row, recur_torch
from loraserve.model.recurrent.records import cut_records, fresh_records, is_decode_step
from loraserve.model.recurrent.shortconv import causal_conv, matrix
from loraserve.model.weights import WeightSource

USE_C = True  # the C recurrence (`kernels/deltanet.c`) where built; False: the torch reference


class GatedDeltaNet(nn.Module):
    """The gated delta-net mixer of layer ``i``: [T, hidden] -> [T, hidden]."""

    def __init__(self, cfg: ModelConfig, i: int, w: WeightSource) -> None:
        super().__init__()
        p = f"blk.{i}."
        self.i, self.eps = i, cfg.rms_eps
        self.k, self.d_inner, self.s, self.hv, self.hk = _dims(cfg)
        self.conv_dim = 2 * self.hk * self.s + self.hv * self.s
        if not all(isinstance(v, int) and 1 <= v <= 1 << 20 for v in cfg.ssm):
            raise ValueError(f"delta-net sizes {cfg.ssm} (conv kernel, inner, state, value "
                             "heads, key heads) must be 1 to 2^20")  # fmt: skip
        if self.d_inner != self.hv * self.s or self.hv % self.hk:
            raise ValueError(f"delta-net inner size {self.d_inner} is not {self.hv} value heads "
                             f"of {self.s}, or {self.hk} key heads do not divide them")  # fmt: skip
        self.interleave = w.has(p + "ssm_ba.weight")  # qwen3next's layout and head mapping
        ba = ("ssm_ba",) if self.interleave else ("ssm_beta", "ssm_alpha")
        value, ba_rows = self.hv * self.s, (2 * self.hv,) if self.interleave else (self.hv,) * 2
        # early qwen3next files: one ssm_in holding, per key head, its q, k, v and z rows
        legacy = self.interleave and not w.has(p + "attn_qkv.weight") and w.has(p + "ssm_in.weight")
        names = ("ssm_in", *ba) if legacy else ("attn_qkv", "attn_gate", *ba)
        want = (self.conv_dim + value, *ba_rows) if legacy else (self.conv_dim, value, *ba_rows)
        parts = [matrix(w, p + n + ".weight") for n in names]
        for n, m, rows in zip(names, parts, want, strict=True):
            if tuple(m.shape) != (rows, cfg.hidden_size):
                raise ValueError(f"tensor {p + n}.weight has shape {tuple(m.shape)}, "
                                 f"expected {(rows, cfg.hidden_size)}")  # fmt: skip
        self.order = _legacy_order(self.hk, self.s, self.hv // self.hk) if legacy else None
        # one projection of the normed input: q|k|v, z (or ssm_in's rows), the beta and alpha
        # logits; adapters apply to each stored tensor as llama.cpp's build_lora_mm does
        self.in_proj = Projection(p + "attn_qkv_gate.weight", parts)
        self.out_proj = Projection(p + "ssm_out.weight", [matrix(w, p + "ssm_out.weight")])
        conv = _req(w, p + "ssm_conv1d.weight", (self.conv_dim, self.k))  # [conv_dim, d_conv]
        self.taps = [c.contiguous() for c in conv.t()]
        self.taps_lc = conv.t().contiguous()  # [d_conv, conv_dim]: the C conv step's taps
        self.dt_b = _req(w, p + "ssm_dt.bias", (self.hv,)).reshape(-1)  # [H_v]
        self.a = _req(w, p + "ssm_a", (self.hv,)).reshape(-1)  # [H_v] (-exp(A_log))
        self.norm = _req(w, p + "ssm_norm.weight", (self.s,)).reshape(-1)  # [S]
        r = self.hv // self.hk
        n = float(self.s)  # q, k L2-normed per head: rms_norm(x, eps / S) / sqrt(S)
        self.ones = torch.ones(self.s)  # [S]
        self.inv = torch.tensor(1.0 / math.sqrt(n), dtype=torch.float32)  # also o's scale
        self.inv_f = self.inv.item()  # the float32 value, as the kernel takes it
        self.ba_slices = None  # (beta, alpha) column slices where each is one contiguous run
        if self.interleave:  # ssm_ba rows: per key head g, betas g*2r..g*2r+r-1, then alphas
            g = torch.arange(self.hv) // r * 2 * r + torch.arange(self.hv) % r
            self.beta_cols, self.alpha_cols = g, g + r
            self.kmap = torch.arange(self.hv) // r  # value head -> key head
        else:
            self.beta_cols = torch.arange(self.hv)
            self.alpha_cols = torch.arange(self.hv, 2 * self.hv)
            self.kmap = torch.arange(self.hv) % self.hk
            self.ba_slices = (slice(0, self.hv), slice(self.hv, 2 * self.hv))
        self.kmap_identity = self.hv == self.hk  # each value head reads its own key head
        self.kmap2 = torch.cat((self.kmap, self.kmap + self.hk))  # q's then k's per value head
        self.ones_row = torch.ones(1, self.conv_dim)  # SiLU as gated_act(x, 1) of one row
        self.ba_cols = torch.cat((self.beta_cols, self.alpha_cols)).contiguous()  # [2 H_v]
        self.spec = GdnSpec(self.taps_lc, self.ones_row.reshape(-1), self.ones,
                            self.norm.contiguous(), self.dt_b.contiguous(), self.a.contiguous(),
                            self.ba_cols, self.eps, self.eps / n, self.inv_f,
                            (self.hk, self.hv, self.s, self.k), self.interleave,
                            cfg.scan_chunk)  # fmt: skip
        self.chunk = cfg.scan_chunk  # > 0: the chunked form (`chunked.gdn_scan`)
        self.state_size = self.state_shape(cfg)[0]  # the chunked form's records are larger
        # the C decode step and the fused layers (in the chunked form: rows the engine
        # sampled, keeping the chunked record beside the recurrence)
        self._c = self.spec.c_struct() if self.order is None else None
        if self.chunk:
            chunked.require()

    @staticmethod
    def state_shape(cfg: ModelConfig) -> tuple[int, ...]:
        """[(d_conv - 1) * conv_dim + H_v * S * S]: the conv rows, then each head's M (in the
        chunked form the carried chunk record, a flag and the decode's M: `gdn_chunk.scan_size`)."""
        k, _, s, hv, hk = _dims(cfg)
        scan = gdn_chunk.scan_size(hv, s, cfg.scan_chunk)
        return ((k - 1) * (2 * hk * s + hv * s) + scan,)

    def forward(self, hs: torch.Tensor) -> torch.Tensor:
        """hs: [T, hidden] (normed) -> [T, hidden]; reads and writes ``ctx.states``."""
        ctx = get_context()
        if ctx.states is None:
            raise RuntimeError("a recurrent layer ran without its sequences' states")
        t, k, s, hv, hk, cd = hs.shape[0], self.k, self.s, self.hv, self.hk, self.conv_dim
        if (
            USE_C
            and hv > 1
            and self._c is not None
            and is_decode_step(ctx.states, t, bool(self.chunk))
        ):
            return self._step(hs, ctx.states)  # one C call between the projections
        mixed = self.in_proj(hs)  # [T, conv_dim + H_v S + 2 H_v]
        if self.order is not None:  # ssm_in's rows -> q|k|v, z (a copy of each value)
            mixed = mixed[:, self.order]
        z = mixed[:, cd : cd + hv * s]
        ba = mixed[:, cd + hv * s :]  # [T, 2 H_v]
        if self.ba_slices is not None:  # views, no gather
            beta_l, alpha_l = ba[:, self.ba_slices[0]], ba[:, self.ba_slices[1]]  # [T, H_v]
        else:
            beta_l, alpha_l = ba[:, self.beta_cols], ba[:, self.alpha_cols]
        sole = len(ctx.states) == 1 and (ctx.states[0].lo, ctx.states[0].hi) == (0, t)
        qkv = None if sole else torch.empty(t, cd)  # one sequence: its own rows
        n_conv = (k - 1) * cd
        per_seq = []
        for seq in ctx.states:
            lo, hi = seq.lo, seq.hi
            st = seq.state[self.i]
            xpad = torch.cat((st[:n_conv].view(k - 1, cd), mixed[lo:hi, :cd]))
            pre = causal_conv(xpad, self.taps)  # [n, conv_dim]
            act = gated_act(pre, torch.ones_like(pre), "silu")  # SiLU, row-invariant
            if qkv is None:  # the step's only sequence: its rows are all the rows
                qkv = act
            else:
                qkv[lo:hi] = act
            per_seq.append((seq, xpad))
        n = float(s)  # q, k L2-normed per head: rms_norm(x, eps / S) / sqrt(S), as llama.cpp
        ones, inv = self.ones, self.inv
        q = rms_norm(qkv[:, : hk * s].reshape(t, hk, s).contiguous(), ones, self.eps / n) * inv
        kk = rms_norm(qkv[:, hk * s : 2 * hk * s].reshape(t, hk, s).contiguous(), ones,
                      self.eps / n) * inv  # fmt: skip
        if not self.kmap_identity:  # [T, H_v, S]: each value head's key head
            q, kk = q[:, self.kmap], kk[:, self.kmap]
        v = qkv[:, 2 * hk * s :].view(t, hv, s)
        o = torch.empty(t, hv, s)
        spans, m_in, m_out, snaps = [], [], [], []
        for seq, xpad in per_seq:  # each sequence's new state and snapshots, conv rows filled
            lo, hi = seq.lo, seq.hi
            spans.append((lo, hi))
            m_in.append(seq.state[self.i][n_conv:])  # [H_v S S]: M [H_v, S (value), S (key)]
            seq.out[self.i] = out = torch.empty(self.state_size)
            out[:n_conv] = xpad[hi - lo :].reshape(-1)
            m_out.append(out[n_conv:])
            snaps.append(cut_records(self.i, seq, xpad, k, n_conv, self.state_size, out))
        rows = (q, kk, v, ba, alpha_l, beta_l, o)
        if self.chunk:  # the chunked form for prompt rows, the recurrence for decode rows
            chunked.gdn_scan(self, ctx.states, spans, m_in, m_out, snaps, rows,
                             partial(self._recur, rows=rows))  # fmt: skip
        else:
            self._recur(spans, m_in, m_out, snaps, rows)
        # the prompt's temporaries go before the next ones are made (a 512-token step of
        # the qwen35 bench model held ~120 MiB of them into its output projection)
        del q, kk, v, qkv, per_seq, xpad, pre, act, snaps, rows
        normed = rms_norm(o, self.norm, self.eps).view(t, hv * s)  # [T, H_v S]
        del o
        zc = torch.empty(t, hv * s).copy_(z)  # contiguous rows: the C kernel's layout
        del mixed, z, ba, beta_l, alpha_l
        gated = gated_act(zc, normed, "silu")  # SiLU(z) * norm(o)
        del zc, normed
        return self.out_proj(gated)

    def _recur(
        self, spans: list[tuple[int, int]], m_in: list[torch.Tensor], m_out: list[torch.Tensor],
        snaps: list[list[tuple[int, torch.Tensor]]], rows: tuple[torch.Tensor, ...],
    ) -> None:  # fmt: skip
        """The recurrent form: sequence z's rows ``spans[z]`` from M ``m_in[z]`` into
        ``m_out[z]`` and (row, M) ``snaps[z]``, its outputs into o's rows; rows = (q, k, v, ba,
        alpha logits, beta logits, o) of the step (`kernels.deltanet.gdn_recur`, else the
        torch reference `recur_torch` with each row's gates alone)."""
        q, kk, v, ba, alpha_l, beta_l, o = rows
        if USE_C and self.hv > 1 and kernel.available():
            g, beta = kernel.gdn_gates(ba, self.ba_cols, self.dt_b, self.a)  # [T, H_v] each
            kernel.gdn_recur(spans, m_in, m_out, q, kk, v, g, beta, self.inv_f, o, snaps)
            return
        idx = [r for lo, hi in spans for r in range(lo, hi)]
        gates = {r: gate_row(alpha_l[r], beta_l[r], self.dt_b, self.a) for r in idx}
        g, beta = torch.zeros(q.shape[0], self.hv), torch.zeros(q.shape[0], self.hv)
        for r, (gr, br) in gates.items():
            g[r], beta[r] = gr, br
        recur_torch(spans, m_in, m_out, q, kk, v, g, beta, self.inv, o, snaps)

    def _step(self, hs: torch.Tensor, seqs: list[SeqStep]) -> torch.Tensor:
        """A decode step (row q the one new row of sequence q): `forward`'s float operations
        on the same values in one C call between the projections (`kernels.deltanet.gdn_step`:
        conv and SiLU, q and k normed, the gates, the recurrence, the output norm and gate).
        Each sequence's new state record is made (`fresh_records`, which also makes it the
        snapshot of a block that ends with the row) and written by the call."""
        mixed = self.in_proj(hs)  # [T, conv_dim + H_v S + 2 H_v]
        recs = self.new_records(seqs)
        out = kernel.gdn_step(mixed, [q.state[self.i] for q in seqs], recs, self._c,
                              self.state_size)  # [T, H_v S]  # fmt: skip
        return self.out_proj(out)

    def new_records(self, seqs: list[SeqStep]) -> list[torch.Tensor]:
        """A decode step's new state record of each of ``seqs`` (`records.fresh_records`)."""
        return fresh_records(self.i, self.state_size, seqs)

    def fused_spec(self) -> GdnSpec | None:
        """This mixer's tensors for the fused C layers (`kernels.layers`); None where the
        decode step runs in Python (one value head, early qwen3next's ssm_in layout)."""
        return self.spec if self._c is not None and self.hv > 1 else None


def _legacy_order(hk: int, s: int, r: int) -> torch.Tensor:
    """Columns of ``ssm_in | ssm_ba`` outputs in q|k|v, z, ba order: ssm_in holds, per key head
    g, its q [S], k [S], v [r S] and z [r S] (llama.cpp's legacy ``build_qkvz``)."""
    blk = 2 * s + 2 * r * s
    g = torch.arange(hk).unsqueeze(1) * blk  # [H_k, 1]: each key head's first row
    q = (g + torch.arange(s)).reshape(-1)
    k = (g + s + torch.arange(s)).reshape(-1)
    v = (g + 2 * s + torch.arange(r * s)).reshape(-1)
    z = (g + 2 * s + r * s + torch.arange(r * s)).reshape(-1)
    ba = hk * blk + torch.arange(2 * r * hk)  # ssm_ba's 2 H_v columns, as they are
    return torch.cat((q, k, v, z, ba))


def _dims(cfg: ModelConfig) -> tuple[int, int, int, int, int]:
    """(d_conv, d_inner, S, H_v, H_k) of the config's delta-net layers."""
    k, d_inner, s, hv, hk = cfg.ssm
    return k, d_inner, s, hv, hk


def _req(w: WeightSource, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    t = w.float(name)
    if t is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    if t.numel() != math.prod(shape):
        raise ValueError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
    return t.float().reshape(shape)
