"""The gated delta rule's chunked form in C (`kernels/gdn_chunk.c`): within float32 rounding of
the token-by-token recurrence (`kernels.deltanet.gdn_recur`), outputs and full states
(`state_of`); bit for bit the same outputs, records and snapshots however a sequence's rows
are cut into calls (mid-chunk, one row at a time), batched with other sequences, at 1 or 2
threads, and resumed from a snapshot; corrupt records and sizes that do not fit refused; its
log gates are `gdn_gates`' gates before their expf, bit for bit."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loraserve.kernels import deltanet
from loraserve.kernels import gdn_chunk as gc

pytestmark = pytest.mark.skipif(not gc.available(), reason="C kernels not built here")

Rows = dict[str, torch.Tensor]  # q, k, v, lg, beta of one or more sequences' rows


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _rows(t: int, h: int, s: int, seed: int) -> Rows:
    gen = torch.Generator().manual_seed(seed)

    def unit() -> torch.Tensor:  # rows of L2 norm 1, as the model's q and k
        return torch.nn.functional.normalize(torch.randn(t, h, s, generator=gen), dim=-1)

    wide = torch.randn(t, h * s + 3, generator=gen)  # v: a view into wider rows
    return dict(q=unit(), k=unit(), v=wide[:, 2 : 2 + h * s].view(t, h, s),
                lg=-2 * torch.rand(t, h, generator=gen),
                beta=torch.rand(t, h, generator=gen) * 0.98 + 0.01)  # fmt: skip


def _cat(parts: list[Rows]) -> Rows:
    out = {n: torch.cat([p[n] for p in parts]) for n in ("q", "k", "lg", "beta")}
    return out | {"v": torch.cat([p["v"] for p in parts])}


def _run(x: Rows, spans: list[tuple[int, int]], recs: list[torch.Tensor], c: int,
         snap_rows: list[list[int]] | None = None) -> tuple:  # fmt: skip
    """One call: (o, new records, snapshots [[(row, record)]])."""
    t, h, s = x["q"].shape
    o = torch.full((t, h, s), float("nan"))
    out = [torch.full_like(r, float("nan")) for r in recs]
    snaps = [[(r, torch.full_like(recs[0], float("nan"))) for r in z]
             for z in (snap_rows or [[] for _ in spans])]  # fmt: skip
    keep = [r.clone() for r in recs]
    gc.gdn_chunk(spans, recs, out, x["q"], x["k"], x["v"], x["lg"], x["beta"],
                 1 / math.sqrt(s), o, snaps, c)  # fmt: skip
    assert all(_same(a, b) for a, b in zip(keep, recs, strict=True)), "rec_in written"
    return o, out, snaps


def _pieces(x: Rows, cuts: list[int], rec: torch.Tensor, c: int) -> tuple:
    """The rows cut at ``cuts`` into one call each: (o, final record, record after each cut)."""
    os, after = [], []
    for lo, hi in zip([0, *cuts], [*cuts, x["q"].shape[0]], strict=True):
        o, (rec,), _ = _run(x, [(lo, hi)], [rec], c)
        os.append(o[lo:hi])
        after.append(rec)
    return torch.cat(os), rec, after


@pytest.mark.parametrize(
    "h,s,c,t", [(1, 5, 4, 23), (3, 16, 4, 30), (2, 64, 16, 70), (4, 128, 16, 53), (2, 20, 16, 40),
                (1, 128, 4, 3)],
)  # fmt: skip
def test_equals_the_recurrence(h: int, s: int, c: int, t: int) -> None:
    """Outputs and the full state after the last row (`state_of`) within float32 rounding of
    the recurrence, over several chunks and a partial one, from a zero and a mid-chunk record."""
    x = _rows(t, h, s, seed=h * 100 + s + c)
    n = gc.record_size(h, s, c)
    o, (rec,), _ = _run(x, [(0, t)], [torch.zeros(n)], c)
    want_o, m = torch.empty(t, h, s), torch.empty(h * s * s)
    deltanet.gdn_recur([(0, t)], [torch.zeros(h * s * s)], [m], x["q"], x["k"], x["v"],
                       torch.exp(x["lg"]), x["beta"], 1 / math.sqrt(s), want_o, [[]])  # fmt: skip
    torch.testing.assert_close(o, want_o, rtol=1e-5, atol=1e-6 * want_o.abs().max().item())
    state = gc.state_of(rec, h, s, c).reshape(-1)
    torch.testing.assert_close(state, m, rtol=1e-5, atol=1e-6 * m.abs().max().item())
    assert int(rec[-1]) == t % c
    cut = t // 2 + 1  # resumed from a record with pending rows
    o2, rec2, _ = _pieces(x, [cut], torch.zeros(n), c)
    assert _same(o2, o) and _same(rec2, rec)


def test_state_of_a_boundary_record_is_its_state() -> None:
    h, s, c = 2, 8, 4
    rec = torch.zeros(gc.record_size(h, s, c))
    rec[: h * s * s] = torch.randn(h * s * s)
    assert _same(gc.state_of(rec, h, s, c).reshape(-1), rec[: h * s * s])


@pytest.mark.parametrize(
    "h,s,c,t", [(2, 16, 4, 37), (3, 128, 16, 70), (2, 20, 16, 50), (4, 64, 16, 33), (1, 7, 1, 9)]
)
def test_bits_do_not_depend_on_the_calls(h: int, s: int, c: int, t: int) -> None:
    """One call == random pieces (cut mid-chunk, single rows) == batched with other sequences
    == 2 threads; a snapshot after row r == the record of a run stopping there; a run resumed
    from a snapshot continues with the same bits."""
    rnd = random.Random(t * s + c)
    x = _rows(t, h, s, seed=t + s)
    n = gc.record_size(h, s, c)
    picks = sorted(rnd.sample(range(t), 5)) + [t - 1]
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        o, (rec,), (snaps,) = _run(x, [(0, t)], [torch.zeros(n)], c, [picks])
        torch.set_num_threads(2)
        o2, (rec2,), (snaps2,) = _run(x, [(0, t)], [torch.zeros(n)], c, [picks])
    finally:
        torch.set_num_threads(old)
    assert _same(o2, o) and _same(rec2, rec)
    assert all(_same(a, b) for (_, a), (_, b) in zip(snaps, snaps2, strict=True))
    assert _same(snaps[-1][1], rec)
    for _ in range(3):  # random pieces, with runs of single rows
        cuts = sorted(set(rnd.sample(range(1, t), 6) + list(range(c + 1, c + 4))) - {t})
        op, recp, after = _pieces(x, cuts, torch.zeros(n), c)
        assert _same(op, o) and _same(recp, rec), f"cuts {cuts}"
        for r, snap in snaps:  # a snapshot equals the record of a run stopping after row r
            if r + 1 in cuts:
                assert _same(after[cuts.index(r + 1)], snap), f"row {r}"
    others = [_rows(m, h, s, seed=m) for m in (c + 3, 0, 2 * c)]  # batched, ours in between
    part = _run(others[2], [(0, c + 1)], [torch.zeros(n)], c)[1][0]  # a record with pending rows
    rec0 = [torch.zeros(n), torch.zeros(n), part]
    xb = _cat([others[0], x, others[1], others[2]])
    lo = [0, c + 3, c + 3 + t, c + 3 + t]
    spans = [(lo[0], lo[1]), (lo[1], lo[2]), (lo[2], lo[2]), (lo[3], lo[3] + 2 * c)]
    ob, recb, snapb = _run(xb, spans, [rec0[0], torch.zeros(n), rec0[1], rec0[2]], c,
                           [[1], picks, [], [0, 2 * c - 1]])  # fmt: skip
    assert _same(ob[lo[1] : lo[2]], o) and _same(recb[1], rec)
    assert all(_same(a, b) for (_, a), (_, b) in zip(snapb[1], snaps, strict=True))
    assert _same(recb[2], rec0[1]) and _same(snapb[3][1][1], recb[3])
    r, snap = snaps[2]  # resumed from the snapshot after row r
    orr, (recr,), _ = _run(x, [(r + 1, t)], [snap], c)
    assert _same(orr[r + 1 :], o[r + 1 :]) and _same(recr, rec)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([(2, 16, 4), (3, 20, 16), (1, 128, 16), (2, 7, 1)]),
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9), st.booleans()), max_size=8),
    st.sampled_from([1, 2]),
)
def test_any_calls_same_bits(
    shape: tuple[int, int, int], steps: list[tuple[int, int, bool]], threads: int
) -> None:
    """Two sequences fed by any series of calls (each taking some rows of both, batched,
    records in place or not, 1 or 2 threads) end with the bits of one call each."""
    h, s, c = shape
    total = [sum(a for a, _, _ in steps), sum(b for _, b, _ in steps)]
    seqs = [_rows(t, h, s, seed=300 + z) for z, t in enumerate(total)]
    rec0 = torch.zeros(gc.record_size(h, s, c))
    want = [_run(x, [(0, t)], [rec0], c)[:2] for x, t in zip(seqs, total, strict=True)]
    recs, outs, done = [rec0.clone(), rec0.clone()], [[], []], [0, 0]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for ka, kb, in_place in steps:
            x = _cat([{n: v[done[1] : done[1] + kb] for n, v in seqs[1].items()},
                      {n: v[done[0] : done[0] + ka] for n, v in seqs[0].items()}])  # fmt: skip
            spans = [(kb, kb + ka), (0, kb)]  # sequence 1's rows first
            new = recs if in_place else [torch.empty_like(r) for r in recs]
            o = torch.empty(ka + kb, h, s)
            gc.gdn_chunk(spans, recs, new, x["q"], x["k"], x["v"], x["lg"], x["beta"],
                         1 / math.sqrt(s), o, [[], []], c)  # fmt: skip
            for z in (0, 1):
                outs[z].append(o[spans[z][0] : spans[z][1]])
                done[z] += (ka, kb)[z]
            recs = new
    finally:
        torch.set_num_threads(old)
    for z in (0, 1):
        assert _same(torch.cat([torch.empty(0, h, s), *outs[z]]), want[z][0][: total[z]])
        assert _same(recs[z], want[z][1][0])


def test_pending_slots_are_zero() -> None:
    h, s, c = 2, 8, 4
    x = _rows(6, h, s, seed=3)
    _, (rec,), _ = _run(x, [(0, 6)], [torch.zeros(gc.record_size(h, s, c))], c)
    pend = rec[h * s * s : -1]
    pk, pu, pg = pend[: h * 3 * s].view(h, 3, s), pend[h * 3 * s : 2 * h * 3 * s].view(h, 3, s), \
        pend[2 * h * 3 * s :].view(h, 3)  # fmt: skip
    assert rec[-1] == 2 and (pk[:, 2:] == 0).all() and (pu[:, 2:] == 0).all()
    assert (pg[:, 2:] == 0).all() and (pk[:, :2] != 0).all() and (pg[:, :2] != 0).all()


@pytest.mark.parametrize("cnt", [2.5, 4.0, -1.0, float("nan"), 1e30])
def test_corrupt_record_refused(cnt: float) -> None:
    h, s, c = 2, 8, 4
    x = _rows(3, h, s, seed=1)
    rec = torch.zeros(gc.record_size(h, s, c))
    rec[-1] = cnt
    with pytest.raises(ValueError, match="corrupt record"):
        _run(x, [(0, 3)], [rec], c)
    with pytest.raises(ValueError, match="corrupt record"):
        gc.state_of(rec, h, s, c)


def test_bad_arguments_refused() -> None:
    h, s, c = 2, 8, 4
    x = _rows(5, h, s, seed=2)
    n = gc.record_size(h, s, c)
    rec = torch.zeros(n)
    bad = [
        ([(0, 6)], [rec], None, c),  # span past the rows
        ([(0, 5)], [torch.zeros(n - 1)], None, c),  # short record
        ([(0, 5)], [rec, rec], None, c),  # one record per span
        ([(0, 5)], [rec], [[3, 1]], c),  # snapshot rows not ascending
        ([(0, 5)], [rec], [[5]], c),  # snapshot row past the span
        ([(0, 5)], [rec], None, 0),  # chunk size
        ([(0, 5)], [rec.double()], None, c),
    ]
    for spans, recs, snap_rows, chunk in bad:
        with pytest.raises(ValueError):
            _run(x, spans, recs, chunk, snap_rows)
    o = torch.empty(5, h, s)
    two = torch.zeros(2 * n)
    for ins, outs, snaps in (
        ([two[:n]], [two[1 : n + 1]], [[]]),  # partly the same memory
        ([rec], [rec], [[(1, rec)]]),  # a snapshot into the record
        ([rec, rec], [rec, torch.zeros(n)], [[], []]),  # read by one, written by the other
    ):
        spans = [(0, 5)] * len(ins)
        with pytest.raises(ValueError, match="overlap"):
            gc.gdn_chunk(spans, ins, outs, x["q"], x["k"], x["v"], x["lg"], x["beta"], 1.0, o,
                         snaps, c)  # fmt: skip
    v = torch.randn(5, s, h).transpose(1, 2)  # [T, H, S] with heads not contiguous
    with pytest.raises(ValueError, match="strides"):
        gc.gdn_chunk([(0, 5)], [rec], [torch.zeros(n)], x["q"], x["k"], v, x["lg"], x["beta"],
                     1.0, o, [[]], c)  # fmt: skip


def test_zero_rows_copy_the_record() -> None:
    h, s, c = 2, 16, 4
    x = _rows(7, h, s, seed=5)
    _, (rec,), _ = _run(x, [(0, 7)], [torch.zeros(gc.record_size(h, s, c))], c)
    o, (same,), _ = _run(x, [(3, 3)], [rec], c)
    assert _same(same, rec) and torch.isnan(o).all()
    o, recs, _ = _run({n: v[:0] for n, v in x.items()}, [], [], c)  # no sequences at all
    assert o.numel() == 0 and recs == []


def test_log_gates_are_the_gates_before_expf() -> None:
    """exp(lg) in libm's expf is `deltanet.gdn_gates`' g bit for bit; beta the same."""
    gen = torch.Generator().manual_seed(7)
    t, h = 40, 6
    logits = torch.randn(t, h, generator=gen) * 6
    alpha = torch.randn(t, h, generator=gen) * 12  # past softplus' threshold (20) too
    ba = torch.cat((logits, alpha, torch.randn(t, 2, generator=gen)), 1)
    cols, dt_b = torch.arange(2 * h), torch.randn(h, generator=gen)
    a = -torch.rand(h, generator=gen) * 4
    lg, beta = gc.log_gates(ba, cols, dt_b, a)
    g, beta2 = deltanet.gdn_gates(ba, cols, dt_b, a)
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.expf.argtypes, libm.expf.restype = [ctypes.c_float], ctypes.c_float
    eg = torch.tensor([libm.expf(v) for v in lg.reshape(-1).tolist()]).view(t, h)
    assert _same(eg, g) and _same(beta, beta2)
    with pytest.raises(ValueError, match="outside"):
        gc.log_gates(ba, cols + 2 * h + 2, dt_b, a)
