"""Mamba-1 (llama.cpp ``build_mamba_layer``: ``ggml_ssm_conv`` then ``ggml_ssm_scan`` with a
per-channel decay; jamba).

``ssm_in`` gives x and z [d_inner] each. x goes through the causal depthwise convolution
(kernel ``ssm_conv1d`` [d_inner, d_conv], plus bias, SiLU); ``ssm_x`` projects it to dt
[R], B and C [N] (each RMS-normed by ``ssm_dt_norm`` / ``ssm_b_norm`` / ``ssm_c_norm`` where
the file has them, as jamba's); ``ssm_dt`` (with its bias) widens dt to [d_inner]. With
dt' = softplus(dt) the state s [d_inner, N] of a sequence runs s <- s exp(dt' A) + (x dt') B
(A = ``ssm_a`` [d_inner, N], negative) and each token reads y = sum_n s C; then
(y + x D) SiLU(z) and ``ssm_out``.

Row independence as `Mamba2`: the scan runs token by token per sequence in a fixed order on
shapes that never depend on the batch or the chunking. A sequence's state is one flat tensor:
the conv rows [(d_conv - 1), d_inner], then s [d_inner, N].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loraserve.kernels import ssm_scan
from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.layers import gated_act, rms_norm
from loraserve.model.projection import Projection
from loraserve.model.recurrent.shortconv import causal_conv, matrix
from loraserve.model.weights import WeightSource


class Mamba1(nn.Module):
    """The Mamba-1 mixer of layer ``i``: [T, hidden] -> [T, hidden]."""

    def __init__(self, cfg: ModelConfig, i: int, w: WeightSource) -> None:
        super().__init__()
        p = f"blk.{i}."
        self.i, self.eps = i, cfg.rms_eps
        self.k, self.d_inner, self.n, self.r = cfg.ssm[:4]

        def proj(stem: str, bias: bool = False) -> Projection:
            b = _req(w, p + stem + ".bias") if bias else None
            return Projection(p + stem + ".weight", [matrix(w, p + stem + ".weight")], b)

        self.in_proj, self.out_proj = proj("ssm_in"), proj("ssm_out")
        self.x_proj, self.dt_proj = proj("ssm_x"), proj("ssm_dt", bias=True)
        conv = _req(w, p + "ssm_conv1d.weight")  # [d_inner, d_conv]
        self.taps = [c.contiguous() for c in conv.t()]
        self.conv_b = _req(w, p + "ssm_conv1d.bias")  # [d_inner]
        self.a = _req(w, p + "ssm_a").contiguous()  # [d_inner, N] (negative)
        self.d = _req(w, p + "ssm_d").reshape(-1)  # [d_inner]
        names = ("ssm_dt_norm", "ssm_b_norm", "ssm_c_norm")
        norms = [w.float(p + n + ".weight") for n in names]
        self.norms = [n.float() for n in norms] if all(n is not None for n in norms) else None

    @staticmethod
    def state_shape(cfg: ModelConfig) -> tuple[int, ...]:
        """[(d_conv - 1) * d_inner + d_inner * N]: the conv rows, then the scan state."""
        k, d_inner, n = cfg.ssm[:3]
        return ((k - 1) * d_inner + d_inner * n,)

    def forward(self, hs: torch.Tensor) -> torch.Tensor:
        """hs: [T, hidden] (normed) -> [T, hidden]; reads and writes ``ctx.states``."""
        ctx = get_context()
        if ctx.states is None:
            raise RuntimeError("a recurrent layer ran without its sequences' states")
        t = hs.shape[0]
        di, n, r, k = self.d_inner, self.n, self.r, self.k
        xz = self.in_proj(hs)  # [T, 2 d_inner]
        x_in, z = xz[:, :di], xz[:, di:]
        xc = torch.empty(t, di)
        n_conv = (k - 1) * di
        pads = []
        for seq in ctx.states:
            st = seq.state[self.i]
            xpad = torch.cat((st[:n_conv].view(k - 1, di), x_in[seq.lo : seq.hi]))
            pre = causal_conv(xpad, self.taps) + self.conv_b
            xc[seq.lo : seq.hi] = gated_act(pre, torch.ones_like(pre), "silu")
            pads.append(xpad)
        xdb = self.x_proj(xc)  # [T, R + 2N]
        dt, b, c = xdb[:, :r].contiguous(), xdb[:, r : r + n].contiguous(), xdb[:, r + n :]
        c = c.contiguous()
        if self.norms is not None:  # jamba: dt, B and C RMS-normed
            dt = rms_norm(dt, self.norms[0], self.eps)
            b = rms_norm(b, self.norms[1], self.eps)
            c = rms_norm(c, self.norms[2], self.eps)
        dt = self.dt_proj(dt)  # [T, d_inner]
        spans = [(seq.lo, seq.hi) for seq in ctx.states]
        states = [seq.state[self.i][n_conv:].view(di, n) for seq in ctx.states]
        wanted = [
            list(range(seq.hi - seq.lo)) if seq.every else sorted(dict(seq.cuts))
            for seq in ctx.states
        ]
        scan = ssm_scan.scan1 if ssm_scan.available() else scan_torch
        y, finals, snaps = scan(xc, dt, self.a, b, c, spans, states, wanted)
        j = 0
        for q, (seq, xpad) in enumerate(zip(ctx.states, pads, strict=True)):
            cuts = dict(seq.cuts)
            for w in wanted[q]:
                snap = torch.cat((xpad[w + 1 : w + k].reshape(-1), snaps[j].reshape(-1)))
                j += 1
                if w in cuts:
                    seq.snaps.setdefault(cuts[w], {})[self.i] = snap
                if seq.every:  # a draft's rows: the state after each (rollback)
                    seq.rows.setdefault(self.i, []).append(snap)
            tail = xpad[seq.hi - seq.lo :].reshape(-1)
            seq.out[self.i] = torch.cat((tail, finals[q].reshape(-1)))
        zc = torch.empty(t, di).copy_(z)  # rows of d_inner: the C kernel's layout at T = 1
        out = gated_act(zc, y + xc * self.d, "silu")  # [T, d_inner]
        return self.out_proj(out)


def scan_torch(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    spans: list[tuple[int, int]],
    states: list[torch.Tensor],
    wanted: list[list[int]],
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The scan in torch, token by token (the C kernel's reference and fallback): x, dt
    [T, D] (dt before softplus), a [D, N], b, c [T, N]; sequence q owns rows spans[q], starts
    from states[q] [D, N] and keeps the state after each local row of wanted[q].
    -> (y [T, D], final states, the kept states in order)."""
    d, n = a.shape
    y = torch.empty(x.shape[0], d)
    finals, snaps = [], []
    for (lo, hi), s, want in zip(spans, states, wanted, strict=True):
        keep = set(want)
        for j in range(hi - lo):
            row = lo + j  # softplus and exp per row alone: the same bits in any batch
            dts = F.softplus(dt[row])  # [D]
            da = torch.exp(dts.view(d, 1) * a)  # [D, N]
            s = s * da + b[row].view(1, n) * (x[row] * dts).view(d, 1)
            y[row] = (s * c[row].view(1, n)).sum(-1)
            if j in keep:
                snaps.append(s)
        finals.append(s)
    return y, finals, snaps


def _req(w: WeightSource, name: str) -> torch.Tensor:
    t = w.float(name)
    if t is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return t.float()
