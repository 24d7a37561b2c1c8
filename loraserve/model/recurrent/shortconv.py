"""Short convolution (lfm2; llama.cpp ``build_shortconv_block`` with ``ggml_ssm_conv``).

``in_proj`` gives three [T, C] parts b, c, x; the causal depthwise convolution of b*x over the
last L positions (kernel ``shortconv.conv`` [C, L]) is gated by c and projected by
``out_proj``. The state of a sequence is its last L-1 rows of b*x ([L-1, C], zeros at the
start). Each output element is sum_j xpad[t+j] * w[:, j] accumulated in order j = 0..L-1 as
separate elementwise products and adds over whole rows, so a row's bits depend on its own
window alone: the same alone, batched, chunked anywhere and resumed from a snapshot. Decode
steps of a dense lfm2 run in the fused C layers (`kernels/layers_conv.h`: the same float
operations in the same order), whose state records `records.decode_records` makes.
"""

from __future__ import annotations

import torch
from torch import nn

from loraserve.kernels.layers_spec import ConvSpec
from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.projection import Matrix, Projection
from loraserve.model.weights import WeightSource


class ShortConv(nn.Module):
    """The short-convolution mixer of layer ``i``: [T, hidden] -> [T, hidden]."""

    def __init__(self, cfg: ModelConfig, i: int, w: WeightSource) -> None:
        super().__init__()
        p = f"blk.{i}.shortconv."
        self.i = i
        self.in_proj = Projection(p + "in_proj.weight", [matrix(w, p + "in_proj.weight")])
        self.out_proj = Projection(p + "out_proj.weight", [matrix(w, p + "out_proj.weight")])
        conv = w.float(p + "conv.weight")
        if conv is None:
            raise ValueError(f"model file lacks tensor {p + 'conv.weight'!r}")
        self.taps = [c.contiguous() for c in conv.float().t()]  # L x [C]: tap j over channels
        self.taps_lc = conv.float().t().contiguous()  # [L, C]: the fused C layers' taps
        self.k = len(self.taps)
        self.state_size = self.taps_lc.numel() - self.taps_lc.shape[1]  # (L-1) C

    @staticmethod
    def state_shape(cfg: ModelConfig) -> tuple[int, ...]:
        """[L-1, hidden]: the last L-1 rows of b*x."""
        return (cfg.conv_kernel - 1, cfg.hidden_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: [T, hidden] (normed) -> [T, hidden]; reads and writes ``ctx.states``."""
        ctx = get_context()
        if ctx.states is None:
            raise RuntimeError("a recurrent layer ran without its sequences' states")
        bcx = self.in_proj(h)  # [T, 3C]
        b, c, x = bcx.chunk(3, dim=-1)
        bx = b * x  # [T, C]
        conv = torch.empty_like(bx)
        k = self.k
        for seq in ctx.states:
            n = seq.hi - seq.lo
            st = seq.state[self.i].view(k - 1, -1)  # [L-1, C] (a fused step's record too)
            xpad = torch.cat((st, bx[seq.lo : seq.hi]))  # [L-1+n, C]
            conv[seq.lo : seq.hi] = causal_conv(xpad, self.taps)
            seq.out[self.i] = xpad[n:].clone()  # the last L-1 rows
            for r, block in seq.cuts:  # state after row lo + r: rows r+1 .. r+L-1 of xpad
                seq.snaps.setdefault(block, {})[self.i] = xpad[r + 1 : r + k].clone()
            if seq.every:  # a draft's rows: the state after each (rollback)
                seq.rows[self.i] = [xpad[r + 1 : r + k].clone() for r in range(n)]
        return self.out_proj(c * conv)

    def fused_spec(self) -> ConvSpec:
        """This mixer's taps for the fused C layers (`kernels.layers`)."""
        return ConvSpec(self.taps_lc)

    def record_shape(self) -> tuple[int, ...]:
        """The shape of a state record (`state_shape`'s): [L-1, C]."""
        return (self.k - 1, self.taps_lc.shape[1])


def causal_conv(xpad: torch.Tensor, taps: list[torch.Tensor]) -> torch.Tensor:
    """xpad [L-1+n, C] (the state, then n new rows), taps L x [C] -> [n, C]: row t is
    sum_j xpad[t+j] * taps[j], accumulated in order j = 0..L-1 (as ggml_ssm_conv)."""
    n = xpad.shape[0] - len(taps) + 1
    acc = xpad[0:n] * taps[0]
    for j in range(1, len(taps)):
        acc = acc + xpad[j : j + n] * taps[j]
    return acc


def matrix(w: WeightSource, name: str) -> Matrix:
    m = w.matrix(name)
    if m is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return m
