"""Mamba-2 (llama.cpp ``build_mamba2_layer``: ``ggml_ssm_conv`` then ``ggml_ssm_scan``).

``ssm_in`` gives z [d_inner], xBC [d_inner + 2 G N] and dt [H]. xBC goes through the causal
depthwise convolution (kernel ``ssm_conv1d`` [conv_dim, d_conv], plus bias, SiLU), then splits
into x [H, P] (P = d_inner / H), B and C [G, N] (head h reads group h // (H / G)). With
dt' = softplus(dt + dt_bias) and dA = exp(dt' A) per head, the state s [H, P, N] of a sequence
runs s <- s dA + B (x dt') and each token reads y = sum_n s C, then y + x D, times SiLU(z), a
grouped RMSNorm (``ssm_norm`` [G, d_inner / G], where the file has one) and ``ssm_out``.

Row independence: the scan runs token by token per sequence in a fixed order, on tensors whose
shapes never depend on the batch or the chunking, so a sequence's bits are the same alone,
batched, in any prefill chunks, and resumed from a snapshot (its state is exactly the one the
uncut sequence had there); `--scan-form chunked` runs the chunked form for every row
(`chunked.py`). A sequence's state is one flat tensor: the conv rows, then s.
dt' and dA are computed value by value in C (`ssm_scan.dt_da`, llama.cpp's formula), the same
bits for prompts, decode steps and the fused C layers (`kernels.layers`), which run a dense
hybrid's decode steps (granitehybrid) in one call with the state records `decode_records`
makes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loraserve.cache.state import SeqStep
from loraserve.kernels import ssd_chunk, ssm_scan
from loraserve.kernels.layers_spec import MambaSpec
from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.layers import gated_act, rms_norm
from loraserve.model.projection import Projection
from loraserve.model.recurrent import chunked
from loraserve.model.recurrent.records import fresh_records, is_decode_step
from loraserve.model.recurrent.shortconv import causal_conv, matrix
from loraserve.model.weights import WeightSource


class Mamba2(nn.Module):
    """The Mamba-2 mixer of layer ``i``: [T, hidden] -> [T, hidden]."""

    def __init__(self, cfg: ModelConfig, i: int, w: WeightSource) -> None:
        super().__init__()
        p = f"blk.{i}."
        self.i, self.eps = i, cfg.rms_eps
        self.k, self.d_inner, self.n, self.h, self.g = _dims(cfg)
        self.conv_dim = self.d_inner + 2 * self.g * self.n
        self.in_proj = Projection(p + "ssm_in.weight", [matrix(w, p + "ssm_in.weight")])
        self.out_proj = Projection(p + "ssm_out.weight", [matrix(w, p + "ssm_out.weight")])
        conv = _req(w, p + "ssm_conv1d.weight")  # [conv_dim, d_conv]
        self.taps = [c.contiguous() for c in conv.t()]
        self.taps_lc = conv.t().contiguous()  # [d_conv, conv_dim]: the C conv step's taps
        self.conv_b = _req(w, p + "ssm_conv1d.bias").contiguous()  # [conv_dim]
        self.dt_b = _req(w, p + "ssm_dt.bias").reshape(-1).contiguous()  # [H]
        self.a = _req(w, p + "ssm_a").reshape(-1).contiguous()  # [H] (negative: -exp(A_log))
        self.d = _req(w, p + "ssm_d").reshape(-1, 1)  # [H, 1]
        self.d_flat = self.d.reshape(-1).contiguous()  # [H]
        norm = w.float(p + "ssm_norm.weight")  # [G, d/G]; absent: no grouped norm (falcon-h1)
        self.norm = None if norm is None else norm.float().reshape(self.g, -1).contiguous()
        self.ones_row = torch.ones(1, self.conv_dim)  # SiLU as gated_act(x, 1) of one row
        self.chunk = cfg.scan_chunk  # > 0: the chunked form (`chunked.py`), every row
        self.state_size = self.state_shape(cfg)[0]
        if self.chunk:
            chunked.require()

    @staticmethod
    def state_shape(cfg: ModelConfig) -> tuple[int, ...]:
        """[(d_conv - 1) * conv_dim + H * P * N]: the conv rows, then the scan state."""
        k, d_inner, n, h, g = _dims(cfg)
        c = cfg.scan_chunk
        scan = ssd_chunk.record_size(h, d_inner // h, n, c) if c else d_inner * n
        return ((k - 1) * (d_inner + 2 * g * n) + scan,)

    def forward(self, hs: torch.Tensor) -> torch.Tensor:
        """hs: [T, hidden] (normed) -> [T, hidden]; reads and writes ``ctx.states``."""
        ctx = get_context()
        if ctx.states is None:
            raise RuntimeError("a recurrent layer ran without its sequences' states")
        t = hs.shape[0]
        di, h, g, k = self.d_inner, self.h, self.g, self.k
        if not self.chunk and is_decode_step(ctx.states, t):  # one C call, both projections
            return self._step(hs, ctx.states)
        zxbcdt = self.in_proj(hs)  # [T, 2 d_inner + 2 G N + H]
        z = zxbcdt[:, :di]
        xbc_in = zxbcdt[:, di : di + self.conv_dim]
        dt_raw = zxbcdt[:, di + self.conv_dim :]  # [T, H]
        sole = len(ctx.states) == 1 and (ctx.states[0].lo, ctx.states[0].hi) == (0, t)
        xbc = None if sole else torch.empty(t, self.conv_dim)  # one sequence: its own rows
        n_conv = (k - 1) * self.conv_dim
        pads, spans = [], []
        for seq in ctx.states:
            lo, hi = seq.lo, seq.hi
            st = seq.state[self.i]
            xpad = torch.cat((st[:n_conv].view(k - 1, self.conv_dim), xbc_in[lo:hi]))
            pre = causal_conv(xpad, self.taps) + self.conv_b
            act = gated_act(pre, torch.ones_like(pre), "silu")  # SiLU, row-invariant
            if xbc is None:  # the step's only sequence: its rows are all the rows
                xbc = act
            else:
                xbc[lo:hi] = act
            pads.append(xpad)
            spans.append((lo, hi))
        if self.chunk:  # the chunked form: (s at the chunk's start, pending rows) records
            dt, _ = ssm_scan.dt_da(dt_raw, self.dt_b, self.a)  # [T, H], each value alone
            y = chunked.ssd_scan(self, ctx.states, xbc, dt, pads, spans)
        else:
            y = self._scan(ctx.states, xbc, dt_raw, pads, spans)
        del pads, xpad, pre, act
        x = xbc[:, :di].view(t, h, -1)
        zc = torch.empty(t, di).copy_(z)  # rows of di: the C kernel's layout even at T = 1
        del zxbcdt, z, xbc_in, dt_raw
        yd = (y + x * self.d).view(t, di)
        del y, x, xbc
        out = gated_act(zc, yd, "silu")  # [T, d_inner]
        del zc, yd
        if self.norm is not None:
            out = rms_norm(out.reshape(t, g, di // g).contiguous(), self.norm, self.eps)
        return self.out_proj(out.view(t, di))

    def _scan(
        self, seqs: list[SeqStep], xbc: torch.Tensor, dt_raw: torch.Tensor,
        pads: list[torch.Tensor], spans: list[tuple[int, int]],
    ) -> torch.Tensor:  # fmt: skip
        """The recurrent form's scan of every sequence (`ssm_scan.scan2`, or `scan_torch`
        without the C kernels): writes each one's new state record and its snapshots;
        -> y [T, H, P]. xbc [T, conv_dim] after the conv, pads: each sequence's conv input
        (its state's conv rows, then its rows)."""
        di, n, h, g, k = self.d_inner, self.n, self.h, self.g, self.k
        n_conv = (k - 1) * self.conv_dim
        states, wanted = [], []
        for seq in seqs:
            states.append(seq.state[self.i][n_conv:].view(h, di // h, n))
            # a cut at the last row is the final state itself (below), not a second copy
            last = -1 if seq.every else seq.hi - seq.lo - 1
            wanted.append(list(range(seq.hi - seq.lo)) if seq.every else
                          sorted(r for r in dict(seq.cuts) if r != last))  # fmt: skip
        dims = (h, di // h, n, g)
        rec = None
        if ssm_scan.available():
            dt, da = ssm_scan.dt_da(dt_raw, self.dt_b, self.a)  # [T, H], each value alone
            # one sequence (decode): its state record [conv rows | scan state] is allocated
            # once and the kernel writes the final state into it (no stack and cat copies)
            rec = torch.empty(n_conv + di * n) if len(spans) == 1 else None
            fin = None if rec is None else rec[n_conv:].view(1, h, di // h, n)
            y, finals, snaps = ssm_scan.scan2(xbc, dt, da, dims, spans, states, wanted, fin)
        else:
            y, finals, snaps = scan_torch(
                xbc, dt_raw, self.dt_b, self.a, dims, spans, states, wanted
            )
        j = 0
        for q, (seq, xpad) in enumerate(zip(seqs, pads, strict=True)):
            cuts = dict(seq.cuts)
            for r in wanted[q]:
                snap = torch.cat((xpad[r + 1 : r + k].reshape(-1), snaps[j].reshape(-1)))
                j += 1
                if r in cuts:
                    seq.snaps.setdefault(cuts[r], {})[self.i] = snap
                if seq.every:  # a draft's rows: the state after each (rollback)
                    seq.rows.setdefault(self.i, []).append(snap)
            if rec is not None:  # the final state is in place already
                rec[:n_conv].copy_(xpad[seq.hi - seq.lo :].reshape(-1))
                seq.out[self.i] = rec
            else:
                seq.out[self.i] = torch.cat(
                    (xpad[seq.hi - seq.lo :].reshape(-1), finals[q].reshape(-1))
                )
            if not seq.every and seq.hi - seq.lo - 1 in cuts:  # (never changed in place)
                seq.snaps.setdefault(cuts[seq.hi - seq.lo - 1], {})[self.i] = seq.out[self.i]
        return y

    def _step(self, hs: torch.Tensor, seqs: list[SeqStep]) -> torch.Tensor:
        """Row q of hs [T, hidden] the one new row of seqs[q] (decode steps): `forward`'s
        float operations on the same values in one C call between the two projections
        (`ssm_scan.mamba2_step`: conv, scan, D skip, gate and norm), which writes each
        sequence's state after its row into a new record; a snapshot after the row is that
        record itself (the same values, never changed)."""
        di, i, h, k = self.d_inner, self.i, self.h, self.k
        zx = self.in_proj(hs)  # [T, 2 d_inner + 2 G N + H]
        dt, da = ssm_scan.dt_da(zx[:, di + self.conv_dim :], self.dt_b, self.a)  # [T, H]
        recs = self.new_records(seqs)
        out = ssm_scan.mamba2_step(
            zx,
            dt,
            da,
            (k, h, di // h, self.n, self.g),
            [s.state[i] for s in seqs],
            recs,
            (self.taps_lc, self.conv_b, self.ones_row, self.d_flat, self.norm),
            self.eps,
        )  # [T, d_inner]
        return self.out_proj(out)

    def new_records(self, seqs: list[SeqStep]) -> list[torch.Tensor]:
        """A decode step's new state record [conv rows | scan state] for each of ``seqs``
        (one new row each), made each sequence's state after its row and, where a block
        ends with the row, that block's snapshot (the same values, never changed)."""
        return fresh_records(self.i, self.state_size, seqs)

    def fused_spec(self) -> MambaSpec | None:
        """This mixer's tensors for the fused C layers (`kernels.layers`); None in the
        chunked form (the per-layer path runs it)."""
        if self.chunk:
            return None
        return MambaSpec(self.taps_lc, self.conv_b, self.ones_row.reshape(-1), self.d_flat,
                         self.norm, self.dt_b, self.a,
                         (self.h, self.d_inner // self.h, self.n, self.g, self.k))  # fmt: skip


def scan_torch(
    xbc: torch.Tensor,
    dt_raw: torch.Tensor,
    dt_b: torch.Tensor,
    a: torch.Tensor,
    dims: tuple[int, int, int, int],
    spans: list[tuple[int, int]],
    states: list[torch.Tensor],
    wanted: list[list[int]],
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The scan in torch, token by token (the C kernel's reference and fallback): xbc
    [T, conv_dim] after the conv, dt_raw [T, H], dt_b, a [H], dims (H, P, N, G); sequence q
    owns rows spans[q], starts from states[q] [H, P, N] and keeps the state after each local
    row of wanted[q]. -> (y [T, H, P], final states, the kept states in order)."""
    h, p, n, g = dims
    di = h * p
    y = torch.empty(xbc.shape[0], h, p)
    finals, snaps = [], []
    for (lo, hi), s, want in zip(spans, states, wanted, strict=True):
        keep = set(want)
        for r in range(hi - lo):
            row = lo + r  # softplus and exp on [H] alone: the same bits in any batch
            dt = F.softplus(dt_raw[row] + dt_b)  # [H]
            da = torch.exp(dt * a)  # [H]
            x = xbc[row, :di].view(h, -1)  # [H, P]
            b = xbc[row, di : di + g * n].view(g, 1, n).repeat_interleave(h // g, 0)
            c = xbc[row, di + g * n :].view(g, 1, n).repeat_interleave(h // g, 0)
            s = s * da.view(h, 1, 1) + b * (x * dt.view(h, 1)).unsqueeze(-1)
            y[row] = (s * c).sum(-1)  # [H, P]
            if r in keep:
                snaps.append(s)
        finals.append(s)
    return y, finals, snaps


def _dims(cfg: ModelConfig) -> tuple[int, int, int, int, int]:
    """(d_conv, d_inner, d_state, heads, groups) of the config's Mamba-2 layers."""
    k, d_inner, n, h, g = cfg.ssm
    return k, d_inner, n, h, g


def _req(w: WeightSource, name: str) -> torch.Tensor:
    t = w.float(name)
    if t is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return t.float()
