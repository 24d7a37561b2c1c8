"""The C selective scans (kernels/ssm_scan.c) against the per-token torch loops they replace
(model/recurrent/mamba2.py `scan_torch`, mamba1.py `scan_torch`): outputs, final states and
kept snapshots bit for bit, on random inputs of several shapes, sequence splits and kept
rows (the torch loop is itself checked against llama-server by the architecture tests); and the
fused Mamba-2 decode step (kernels/mamba2_step.c) against the mixer's torch operations."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from loraserve.kernels import ssm_scan
from loraserve.model.layers import gated_act, rms_norm
from loraserve.model.recurrent import mamba1, mamba2
from loraserve.model.recurrent.shortconv import causal_conv

pytestmark = pytest.mark.skipif(not ssm_scan.available(), reason="C scan not available here")

SPANS = [[(0, 1)], [(0, 7)], [(0, 3), (3, 4), (4, 23), (23, 40)]]


def _wanted(spans: list[tuple[int, int]], gen: torch.Generator) -> list[list[int]]:
    out = []
    for i, (lo, hi) in enumerate(spans):
        if i % 3 == 1:
            out.append(list(range(hi - lo)))  # a draft: every row
        else:
            rows = torch.randperm(hi - lo, generator=gen)[: (hi - lo) // 3]
            out.append(sorted(rows.tolist()))
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (a - b).abs().max()


@pytest.mark.parametrize("dims", [(4, 8, 16, 1), (6, 5, 13, 2), (8, 16, 64, 4), (2, 4, 128, 1),
                                  (3, 3, 7, 3), (16, 8, 48, 2), (1, 2, 256, 1)])  # fmt: skip
@pytest.mark.parametrize("spans", SPANS)
def test_scan2_bitwise(dims: tuple[int, int, int, int], spans: list[tuple[int, int]]) -> None:
    h, p, n, g = dims
    gen = torch.Generator().manual_seed(h * 1000 + p * 100 + n + len(spans))
    t = spans[-1][1]
    conv_dim = h * p + 2 * g * n
    wide = torch.randn(t, conv_dim + 3, generator=gen)  # rows of a wider tensor, as in_proj's
    xbc = wide[:, :conv_dim]
    dt_raw = torch.randn(t, h, generator=gen) * 3
    dt_b = torch.randn(h, generator=gen)
    a = -torch.rand(h, generator=gen) * 4
    states = [torch.randn(h, p, n, generator=gen) for _ in spans]
    keep = [s.clone() for s in states]
    wanted = _wanted(spans, gen)
    y0, f0, s0 = mamba2.scan_torch(xbc, dt_raw, dt_b, a, dims, spans, states, wanted)
    dt = ssm_scan.softplus_rows(dt_raw + dt_b)
    y1, f1, s1 = ssm_scan.scan2(xbc, dt, torch.exp(dt * a), dims, spans, states, wanted)
    _same(y0, y1)
    for q in range(len(spans)):
        _same(f0[q], f1[q])
        _same(states[q], keep[q])  # the inputs are left alone
    assert len(s0) == s1.shape[0]
    for j, snap in enumerate(s0):
        _same(snap, s1[j])


@pytest.mark.parametrize("dims", [(8, 16), (5, 13), (64, 16), (3, 7), (20, 64), (2, 200)])
@pytest.mark.parametrize("spans", SPANS)
def test_scan1_bitwise(dims: tuple[int, int], spans: list[tuple[int, int]]) -> None:
    d, n = dims
    gen = torch.Generator().manual_seed(d * 1000 + n + len(spans))
    t = spans[-1][1]
    x = torch.randn(t, d, generator=gen)
    dt = torch.randn(t, d, generator=gen) * 3
    a = -torch.rand(d, n, generator=gen) * 4
    b, c = torch.randn(t, n, generator=gen), torch.randn(t, n, generator=gen)
    states = [torch.randn(d, n, generator=gen) for _ in spans]
    keep = [s.clone() for s in states]
    wanted = _wanted(spans, gen)
    y0, f0, s0 = mamba1.scan_torch(x, dt, a, b, c, spans, states, wanted)
    y1, f1, s1 = ssm_scan.scan1(x, dt, a, b, c, spans, states, wanted)
    _same(y0, y1)
    for q in range(len(spans)):
        _same(f0[q], f1[q])
        _same(states[q], keep[q])
    assert len(s0) == s1.shape[0]
    for j, snap in enumerate(s0):
        _same(snap, s1[j])


def test_scan1_blocks() -> None:
    """dA built in several blocks of rows (rows x D x N over the block size) and a sequence
    crossing the block edges: the same bits as the token loop."""
    d, n, t = 512, 16, 300  # 128 rows a block
    gen = torch.Generator().manual_seed(7)
    x, dt = torch.randn(t, d, generator=gen), torch.randn(t, d, generator=gen)
    a = -torch.rand(d, n, generator=gen)
    b, c = torch.randn(t, n, generator=gen), torch.randn(t, n, generator=gen)
    spans, states = [(0, 100), (100, 300)], [torch.randn(d, n, generator=gen) for _ in range(2)]
    wanted = [[99], [27, 28, 150, 199]]
    y0, f0, s0 = mamba1.scan_torch(x, dt, a, b, c, spans, states, wanted)
    y1, f1, s1 = ssm_scan.scan1(x, dt, a, b, c, spans, states, wanted)
    _same(y0, y1)
    for q in range(2):
        _same(f0[q], f1[q])
    for j, snap in enumerate(s0):
        _same(snap, s1[j])


def test_probe_finds_torch_sum_order() -> None:
    """The lane probe accepted a width: C sums of rows of 3..1100 values (the cascade's level
    folds included) equal torch's bit for bit, checked here again on fresh rows."""
    lanes = ssm_scan.vector_lanes()
    assert lanes is not None
    gen = torch.Generator().manual_seed(3)
    for k in (1, 5, 8, 31, 128, 513, 2049):
        v = torch.randn(16, k, generator=gen)
        out = torch.empty(16)
        ssm_scan._c().ls_ssm_rowsum(v.data_ptr(), 16, k, lanes, out.data_ptr())
        _same(out, v.sum(-1))


def _mamba2_rows(
    zx: torch.Tensor, states: list[torch.Tensor], dims: tuple[int, ...], w: dict[str, Any]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Each row of zx through `Mamba2.forward`'s torch operations alone (the conv as
    `causal_conv`, the scan as `scan_torch`): -> (out [T, d_inner], each new state record)."""
    k, h, p, n, g = dims
    di, c = h * p, h * p + 2 * g * n
    nc = (k - 1) * c
    outs, recs = [], []
    for q, st in enumerate(states):
        xpad = torch.cat((st[:nc].view(k - 1, c), zx[q : q + 1, di : di + c]))
        pre = causal_conv(xpad, list(w["taps"])) + w["conv_b"]
        xbc = gated_act(pre, torch.ones_like(pre), "silu")  # [1, C]
        s0 = [st[nc:].view(h, p, n)]
        y, fin, _ = mamba2.scan_torch(xbc, zx[q : q + 1, di + c :], w["dt_b"], w["a"],
                                      (h, p, n, g), [(0, 1)], s0, [[]])  # fmt: skip
        yd = (y + xbc[:, :di].view(1, h, p) * w["d"].view(h, 1)).view(1, di)
        zc = torch.empty(1, di).copy_(zx[q : q + 1, :di])  # forward's layout: the C kernel's
        o = gated_act(zc, yd, "silu")
        if w["norm"] is not None:
            o = rms_norm(o.view(1, g, di // g).contiguous(), w["norm"], 1e-5).view(1, di)
        outs.append(o)
        recs.append(torch.cat((xpad[1:].reshape(-1), fin[0].reshape(-1))))
    return torch.cat(outs), recs


@pytest.mark.parametrize("dims", [(4, 4, 8, 16, 1), (4, 6, 5, 13, 2), (3, 8, 16, 64, 4),
                                  (4, 48, 4, 128, 1), (2, 3, 3, 7, 3)])  # fmt: skip
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("with_norm", [True, False])
def test_mamba2_step_bitwise(dims: tuple[int, int, int, int, int], rows: int,
                             with_norm: bool) -> None:  # fmt: skip
    """The fused decode step (conv, scan, D skip, gate, grouped norm in one C call) against
    the mixer's torch operations row by row: outputs and new state records bit for bit,
    one row per sequence, the old records left alone."""
    k, h, p, n, g = dims
    di, c = h * p, h * p + 2 * g * n
    gen = torch.Generator().manual_seed(sum(dims) * 10 + rows)
    zx = torch.randn(rows, 2 * di + 2 * g * n + h + 5, generator=gen)[:, : di + c + h]
    w = {"taps": torch.randn(k, c, generator=gen), "conv_b": torch.randn(c, generator=gen),
         "dt_b": torch.randn(h, generator=gen), "a": -torch.rand(h, generator=gen) * 4,
         "d": torch.randn(h, generator=gen),
         "norm": torch.randn(g, di // g, generator=gen) if with_norm else None}  # fmt: skip
    size = (k - 1) * c + di * n
    states = [torch.randn(size, generator=gen) for _ in range(rows)]
    keep = [s.clone() for s in states]
    ref, ref_recs = _mamba2_rows(zx, states, dims, w)
    dt = ssm_scan.softplus_rows(zx[:, di + c :] + w["dt_b"])
    recs = [torch.empty(size) for _ in range(rows)]
    if rows > 1:  # a record off the vector alignment: the kernel's plain stores
        recs[1] = torch.empty(size + 1)[1:]
    out = ssm_scan.mamba2_step(zx, dt, torch.exp(dt * w["a"]), dims, states, recs,
                               (w["taps"], w["conv_b"], torch.ones(c), w["d"], w["norm"]),
                               1e-5)  # fmt: skip
    _same(ref, out)
    for q in range(rows):
        _same(ref_recs[q], recs[q])
        _same(states[q], keep[q])
