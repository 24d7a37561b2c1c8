"""The gated delta rule's recurrence in C (`kernels/deltanet.c`) against a reference written
here with its order spelt out (each product rounded, each sum over the key index in order from
0, as ggml's CPU loop), bit for bit: outputs, final states and the snapshots after chosen rows,
on random inputs of several head counts and widths, several sequences of different lengths in
one call. The reference is elementwise float32 torch ops only, whose results do not depend on
the CPU or BLAS (torch's bmm, which `recur_torch` uses, may sum in another order elsewhere);
widths that are multiples of 8 run the kernel's register-tiled form, the others (20) its
transposing loop, and empty sequences (state copied through) are in both. The
gates (`gdn_gates`) are each value's own, the decode step's C conv
(`conv_step`) equals the padded torch conv bit for bit, and a whole model's logits with the
C recurrence are those of the torch one within rounding. (Agreement with llama-server itself:
test_deltanet.py and test_archs.py, which run the C path.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from loraserve.engine.runner import ModelRunner
from loraserve.kernels import deltanet as kernel
from loraserve.model.layers import gated_act
from loraserve.model.recurrent import deltanet
from loraserve.model.recurrent.shortconv import causal_conv
from tests.unit.model.deltanet_util import model, run_chunks, variant

pytestmark = pytest.mark.skipif(not kernel.available(), reason="C kernels not built here")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("t,h", [(1, 4), (7, 16), (33, 32), (300, 48), (2000, 24)])
def test_gates_each_value_alone(t: int, h: int) -> None:
    """`gdn_gates` (every C path's gates): within float32 rounding of float64's
    exp(softplus(alpha + dt_b) a) and sigmoid(beta), and each row's bits the same alone, in
    the batch and read from a wider row in another column order."""
    gen = torch.Generator().manual_seed(t * 100 + h)
    alpha = torch.randn(t, h, generator=gen) * 12  # past softplus' threshold (20) too
    beta = torch.randn(t, h, generator=gen) * 6
    dt_b, a = torch.randn(h, generator=gen), -torch.rand(h, generator=gen) * 4
    cols = torch.arange(2 * h)
    g, b = kernel.gdn_gates(torch.cat((beta, alpha), 1), cols, dt_b, a)
    sp = torch.nn.functional.softplus((alpha + dt_b).double()).float()  # float32 steps
    arg = (sp * a).double()  # a last-place error of sp or arg scales exp's by |arg|
    want_g = torch.exp(arg).float().double()  # (float32's underflow included)
    assert ((g.double() - want_g).abs() <= (3e-7 + 3e-7 * arg.abs()) * want_g + 1e-44).all()
    torch.testing.assert_close(b.double(), torch.sigmoid(beta.double()), rtol=3e-7, atol=0)
    wide = torch.cat((torch.randn(t, 3, generator=gen), alpha, beta), 1)  # alpha first
    swapped = torch.cat((torch.arange(h) + 3 + h, torch.arange(h) + 3))
    g2, b2 = kernel.gdn_gates(wide, swapped, dt_b, a)
    assert _same(g2, g) and _same(b2, b)
    for r in {0, t // 2, t - 1}:
        gr, br = kernel.gdn_gates(wide[r : r + 1], swapped, dt_b, a)
        assert _same(gr[0], g[r]) and _same(br[0], b[r]), f"row {r}"


def _matvec(m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[H, S, S] x [H, S] -> [H, S]: sum over j of the rounded m[:, :, j] * x[:, j], j in order."""
    acc = torch.zeros(m.shape[:2])
    for j in range(m.shape[2]):
        acc = acc + m[:, :, j] * x[:, j : j + 1]
    return acc


def recur_in_order(spans, m_in, m_out, q, k, v, g, beta, scale, o, snaps) -> None:  # type: ignore[no-untyped-def]
    """`recur_torch`'s recurrence with every sum's order written out (the oracle)."""
    hv, s = q.shape[1], q.shape[2]
    for (lo, hi), mi, mo, mine in zip(spans, m_in, m_out, snaps, strict=True):
        m = mi.view(hv, s, s)  # [H_v, S (value), S (key)]
        for r in range(hi - lo):
            row = lo + r
            m = m * g[row].view(hv, 1, 1)
            d = (v[row] - _matvec(m, k[row])) * beta[row].view(hv, 1)  # [H_v, S]
            m = m + d.unsqueeze(-1) * k[row].unsqueeze(1)
            o[row] = _matvec(m, q[row]) * scale
            for rr, dst in mine:
                if rr == r:
                    dst.copy_(m.reshape(-1))
        mo.copy_(m.reshape(-1))


def _inputs(h: int, s: int, lens: list[int], seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q = torch.nn.functional.normalize(torch.randn(t, h, s, generator=gen), dim=-1) / math.sqrt(s)
    k = torch.nn.functional.normalize(torch.randn(t, h, s, generator=gen), dim=-1) / math.sqrt(s)
    wide = torch.randn(t, h * s + 5, generator=gen)  # v: a view into wider rows
    g = torch.exp(-torch.rand(t, h, generator=gen) * 2)
    beta = torch.sigmoid(torch.randn(t, h, generator=gen))
    spans, lo = [], 0
    for n in lens:
        spans.append((lo, lo + n))
        lo += n
    m_in = [torch.randn(h * s * s, generator=gen) for _ in lens]
    picks = [sorted({int(x) for x in torch.randint(0, max(n, 1), (3,), generator=gen)} if n
                    else set()) for n in lens]  # fmt: skip
    return dict(spans=spans, m_in=m_in, q=q, k=k, v=wide[:, 3 : 3 + h * s].view(t, h, s),
                g=g, beta=beta, picks=picks)  # fmt: skip


def _run_recur(fn, x: dict, h: int, s: int) -> tuple:  # type: ignore[no-untyped-def]
    t = x["q"].shape[0]
    o = torch.empty(t, h, s)
    m_out = [torch.empty(h * s * s) for _ in x["spans"]]
    snaps = [[(r, torch.empty(h * s * s)) for r in p] for p in x["picks"]]
    snaps = [z + z[:1] for z in snaps]  # one row asked twice: both receive it
    scale = torch.tensor(1.0 / math.sqrt(s), dtype=torch.float32)
    m_keep = [m.clone() for m in x["m_in"]]
    args = (x["spans"], x["m_in"], m_out, x["q"], x["k"], x["v"], x["g"], x["beta"])
    if fn is kernel.gdn_recur:
        fn(*args, scale.item(), o, snaps)
    else:
        fn(*args, scale, o, snaps)
    assert all(_same(a, b) for a, b in zip(m_keep, x["m_in"], strict=True)), "input written"
    return o, m_out, snaps


@pytest.mark.parametrize(
    "h,s,lens",
    [(2, 8, [5]), (4, 16, [1, 9, 3]), (3, 20, [4, 0, 6]), (8, 32, [12, 1]), (16, 64, [3, 2]),
     (4, 128, [2, 3, 1]), (2, 256, [2]), (3, 24, [3, 0, 5])],
)  # fmt: skip
def test_kernel_equals_in_order_recurrence(h: int, s: int, lens: list[int]) -> None:
    x = _inputs(h, s, lens, seed=h * 1000 + s)
    o_c, m_c, sn_c = _run_recur(kernel.gdn_recur, x, h, s)
    o_t, m_t, sn_t = _run_recur(recur_in_order, x, h, s)
    assert _same(o_c, o_t), "outputs differ"
    assert all(_same(a, b) for a, b in zip(m_c, m_t, strict=True)), "final states differ"
    for zc, zt in zip(sn_c, sn_t, strict=True):
        assert all(rc == rt and _same(a, b) for (rc, a), (rt, b) in zip(zc, zt, strict=True))
    assert not torch.isnan(o_c).any() and o_c.abs().sum() > 0, "a degenerate case: no test"


def test_bad_shapes_refused() -> None:
    x = _inputs(2, 8, [3], seed=1)
    with pytest.raises(ValueError, match="outside"):
        kernel.gdn_recur([(0, 9)], x["m_in"], [torch.empty(128)], x["q"], x["k"], x["v"],
                         x["g"], x["beta"], 1.0, torch.empty(3, 2, 8), [[]])  # fmt: skip
    with pytest.raises(ValueError, match="state"):
        kernel.gdn_recur([(0, 3)], x["m_in"], [torch.empty(12)], x["q"], x["k"], x["v"],
                         x["g"], x["beta"], 1.0, torch.empty(3, 2, 8), [[]])  # fmt: skip


def test_model_logits_with_c_and_torch(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    m = model(tmp_path, "qwen35+heads", "Q4_K_M")
    seqs = [c["prompt"] + c["tokens"] for c in variant("qwen35+heads")["answers"]["Q4_K_M"]]
    seqs = seqs[:3]
    cuts = [[3, 4, 5, 9], [1, 6], []]  # prefill chunks ending inside blocks, single rows

    calls = []

    def spy(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **kw)

    real = kernel.gdn_recur
    monkeypatch.setattr(kernel, "gdn_recur", spy)

    def logits(use_c: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(deltanet, "USE_C", use_c)
        return run_chunks(ModelRunner(m.decoder, 16, torch.float16), seqs, cuts)

    with_c = logits(True)
    assert calls, "the C recurrence never ran: no test"
    n = len(calls)
    for a, b in zip(with_c, logits(False), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len(calls) == n, "the torch path called the kernel"


@pytest.mark.parametrize("c,taps,bias", [(8192, 4, False), (3328, 4, True), (37, 4, True),
                                         (20, 2, False), (9, 1, True)])  # fmt: skip
def test_conv_step_equals_padded_conv(c: int, taps: int, bias: bool) -> None:
    """The decode step's C conv (`conv_step`): the bits of causal_conv on the padded rows,
    plus the bias, through gated_act's SiLU; the conv rows after the step written out."""
    gen = torch.Generator().manual_seed(c + taps)
    st = torch.randn((taps - 1) * c, generator=gen) * 3
    row = torch.randn(1, c + 5, generator=gen)[:, 2 : 2 + c] * 3  # a view in a wider row
    w = torch.randn(taps, c, generator=gen)
    b = torch.randn(c, generator=gen) if bias else None
    out = torch.full(((taps - 1) * c,), float("nan"))
    got = kernel.conv_step(st, row, w, b, torch.ones(1, c), out)
    xpad = torch.cat((st.view(taps - 1, c), row))
    pre = causal_conv(xpad, [t.contiguous() for t in w])
    if b is not None:
        pre = pre + b
    want = gated_act(pre, torch.ones_like(pre), "silu")
    assert _same(got, want)
    assert _same(out, xpad[1:].reshape(-1))
