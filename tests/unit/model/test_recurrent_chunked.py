"""The chunked-scan prototype (`bench/chunked_*.py`): values, prefix consistency, bits.

The chunked gated delta rule and Mamba-2 SSD equal the token-by-token recurrences (float64
loops written here) to float32 rounding; with chunks aligned to absolute positions plus the
pending rows carried between steps, a sequence's outputs and states are the same bits in any
pieces, one row at a time, batched with another sequence and at another thread count;
chunks started at a cut instead differ (what the alignment is for); the row-block probe
(`bench.chunked_recur_probe`) gives the C kernels' bits."""

from __future__ import annotations

import pytest
import torch

from bench.chunked_forms import gdn_chunked, ssd_chunked
from bench.chunked_prefix import SSD, check, gdn_form, gdn_rows, naive, ssd_rows
from bench.chunked_scan import gdn_inputs, ssd_inputs

SMALL_GDN = {"hv": 4, "s": 32}
SMALL_SSD = {"h": 4, "p": 16, "n": 32, "g": 1}


def _gdn_loop(d: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """M <- g M; d = beta (v - M k); M <- M + d k^T; o = scale M q, in float64."""
    q, k, v, g, beta = (d[n].double() for n in ("q", "k", "v", "g", "beta"))
    m, out = d["m0"].double().clone(), torch.empty_like(v)
    for t in range(q.shape[0]):
        m = m * g[t].view(-1, 1, 1)
        dd = (v[t] - torch.einsum("hij,hj->hi", m, k[t])) * beta[t].unsqueeze(-1)
        m = m + dd.unsqueeze(-1) * k[t].unsqueeze(1)
        out[t] = torch.einsum("hij,hj->hi", m, q[t]) * d["scale"]
    return out, m


def _ssd_loop(d: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """s <- exp(dt A) s + (x dt) B^T; y = s C (one group), in float64."""
    h, p, n, _ = d["dims"]
    xbc = d["xbc"].double()
    x, b, c = xbc[:, : h * p].view(-1, h, p), xbc[:, h * p : h * p + n], xbc[:, h * p + n :]
    s, y = d["s0"].double().clone(), torch.empty_like(x)
    for t in range(x.shape[0]):
        xdt = x[t] * d["dt"][t].double().unsqueeze(-1)  # [H, P]
        s = torch.exp(d["loga"][t].double()).view(-1, 1, 1) * s + xdt.unsqueeze(-1) * b[t]
        y[t] = s @ c[t]
    return y, s


@pytest.mark.parametrize("c", [16, 32])
def test_chunked_forms_equal_the_recurrences(c: int) -> None:
    dg = gdn_inputs(75, seed=3, **SMALL_GDN)
    o, m = gdn_chunked(dg["q"], dg["k"], dg["v"], dg["g"], dg["beta"], dg["scale"], dg["m0"], c)
    ro, rm = _gdn_loop(dg)
    assert torch.allclose(o.double(), ro, rtol=1e-4, atol=1e-6)
    assert torch.allclose(m.double(), rm, rtol=1e-4, atol=1e-5)
    ds = ssd_inputs(75, seed=3, **SMALL_SSD)
    h, p, n, g = ds["dims"]
    xbc = ds["xbc"]
    y, s = ssd_chunked(xbc[:, : h * p].view(-1, h, p), ds["dt"], ds["loga"],
                       xbc[:, h * p : h * p + n].view(-1, 1, n),
                       xbc[:, h * p + n :].view(-1, 1, n), ds["s0"], c)  # fmt: skip
    ry, rs = _ssd_loop(ds)
    assert torch.allclose(y.double(), ry, rtol=1e-4, atol=1e-4)
    assert torch.allclose(s.double(), rs, rtol=1e-4, atol=1e-5)


def test_aligned_chunks_keep_every_bit() -> None:
    dg, dg1 = gdn_inputs(75, seed=4, **SMALL_GDN), gdn_inputs(50, seed=5, **SMALL_GDN)
    ok = check(gdn_form(dg["scale"]), *gdn_rows(dg), gdn_rows(dg1), 16, trials=3)
    assert ok == {"pieces": True, "batched": True, "threads": True}
    ds, ds1 = ssd_inputs(75, seed=4, **SMALL_SSD), ssd_inputs(50, seed=5, **SMALL_SSD)
    ok = check(SSD, *ssd_rows(ds), ssd_rows(ds1), 16, trials=3)
    assert ok == {"pieces": True, "batched": True, "threads": True}


def test_chunks_started_at_a_cut_differ() -> None:
    dg = gdn_inputs(75, seed=6, **SMALL_GDN)
    assert naive(gdn_form(dg["scale"]), *gdn_rows(dg), 25, 16) > 0.0
    ds = ssd_inputs(75, seed=6, **SMALL_SSD)
    assert naive(SSD, *ssd_rows(ds), 25, 16) > 0.0


def test_row_block_probe_keeps_the_c_kernels_bits() -> None:
    from loraserve.kernels import deltanet, ssm_scan

    if not (deltanet.available() and ssm_scan.available() and ssm_scan.vector_lanes() == 8):
        pytest.skip("the C kernels (or torch's 8-lane sums) are not here")
    from bench.chunked_recur_probe import build, probe, probe_ssd
    from bench.chunked_scan import gdn_c, ssd_c

    lib = build()
    d = gdn_inputs(40, seed=7, hv=3, s=64)
    for x, y in zip(gdn_c(d), probe(lib, d), strict=True):
        assert torch.equal(x.reshape(-1).view(torch.int32), y.reshape(-1).view(torch.int32))
    for g in (1, 2):
        ds = ssd_inputs(40, seed=7, h=4, p=32, n=64, g=g)
        for x, y in zip(ssd_c(ds), probe_ssd(lib, ds), strict=True):
            assert torch.equal(x.reshape(-1).view(torch.int32), y.reshape(-1).view(torch.int32))
