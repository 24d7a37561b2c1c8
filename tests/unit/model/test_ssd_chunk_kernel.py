"""The chunked Mamba-2 scan (kernels/ssd_chunk.c): close to the recurrence (`ssm_scan.scan2`)
on random inputs, and a sequence's outputs, records and snapshots the same bits however its
rows are split into calls, batched with other sequences or threaded; corrupt records and
wrong sizes refused."""

from __future__ import annotations

import ctypes

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loraserve.kernels import ssd_chunk as sc
from loraserve.kernels import ssm_scan

pytestmark = pytest.mark.skipif(
    not (sc.available() and ssm_scan.available()), reason="C kernels not available here"
)

Dims = tuple[int, int, int, int]


def _inputs(dims: Dims, t: int, seed: int) -> tuple[torch.Tensor, ...]:
    """xbc [t, width] (rows of a wider tensor), dt, da, lg [t, H] for random a [H]."""
    h, p, n, g = dims
    gen = torch.Generator().manual_seed(seed)
    width = h * p + 2 * g * n
    xbc = torch.randn(t, width + 5, generator=gen)[:, :width]
    raw = torch.randn(max(t, 1), h, generator=gen) * 2  # dt_da takes 1+ rows
    a = -torch.rand(h, generator=gen) * 3
    dt, da = ssm_scan.dt_da(raw, torch.randn(h, generator=gen), a)
    return xbc, dt[:t], da[:t], dt[:t] * a


def _run(dims: Dims, c: int, xbc: torch.Tensor, dt: torch.Tensor, lg: torch.Tensor,
         rec: torch.Tensor, keep: list[int] = ()) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """One sequence over all rows from rec: (y, final record, snapshots after rows keep)."""
    out = torch.empty_like(rec)
    snaps = [torch.full_like(rec, 7.0) for _ in keep]
    y = sc.ssd_chunk(xbc, dt, lg, dims, [(0, len(xbc))], [rec], [out],
                     [list(zip(keep, snaps, strict=True))], c)  # fmt: skip
    return y, out, snaps


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (a - b).abs().max()


@pytest.mark.parametrize("dims", [(1, 1, 4, 1), (4, 8, 16, 2), (6, 5, 13, 3), (3, 64, 128, 1),
                                  (2, 16, 33, 2), (6, 7, 64, 2)])  # fmt: skip
@pytest.mark.parametrize("c", [4, 16])
def test_matches_recurrence(dims: Dims, c: int) -> None:
    h, p, n, g = dims
    t = 3 * c + 5
    xbc, dt, da, lg = _inputs(dims, t, sum(dims) * c)
    start = torch.randn(h, p, n, generator=torch.Generator().manual_seed(1))
    keep = [0, c - 2, c - 1, c, 2 * c + 3, t - 1]
    y0, f0, s0 = ssm_scan.scan2(xbc, dt, da, dims, [(0, t)], [start], [keep])
    rec = torch.zeros(sc.record_size(h, p, n, c))
    rec[: h * p * n] = start.flatten()
    y1, f1, s1 = _run(dims, c, xbc, dt, lg, rec, keep)
    scale = y0.abs().max()
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5 * scale)
    states = [sc.state_of(r, h, p, n, c) for r in (*s1, f1)]
    for got, want in zip(states, [*s0, f0[0]], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max())
    assert f1[-1] == t % c and s1[2][-1] == 0 and s1[1][-1] == c - 1


def _pieces(t: int, gen: torch.Generator) -> list[tuple[int, int]]:
    cuts = sorted(set(torch.randint(1, t, (t // 4,), generator=gen).tolist()))
    bounds = [0, *cuts, t]
    return list(zip(bounds, bounds[1:], strict=False))


DIMS, C = (4, 16, 32, 2), 16


@pytest.mark.parametrize("seed", range(4))
def test_pieces_and_snapshots_bitwise(seed: int) -> None:
    h, p, n, _ = DIMS
    t = 3 * C + 7
    xbc, dt, _, lg = _inputs(DIMS, t, 100 + seed)
    rec0 = torch.zeros(sc.record_size(h, p, n, C))
    y, final, snaps = _run(DIMS, C, xbc, dt, lg, rec0, list(range(t)))
    _same(snaps[-1], final)
    gen = torch.Generator().manual_seed(seed)
    for pieces in (_pieces(t, gen), [(r, r + 1) for r in range(t)]):
        rec = rec0.clone()
        for i, (a, b) in enumerate(pieces):  # in place and into a new record in turn
            out = rec if i % 2 else torch.empty_like(rec)
            got = sc.ssd_chunk(xbc[a:b], dt[a:b], lg[a:b], DIMS, [(0, b - a)], [rec], [out],
                               [[]], C)  # fmt: skip
            _same(got, y[a:b])
            _same(out, snaps[b - 1])  # a snapshot is the record of a run stopping there
            rec = out
    for r in (0, C - 2, C - 1, C, t - 2):  # resuming from a snapshot
        y2, f2, _ = _run(DIMS, C, xbc[r + 1 :], dt[r + 1 :], lg[r + 1 :], snaps[r])
        _same(y2, y[r + 1 :])
        _same(f2, final)
    for r in range(0, t, 5):  # a stop after row r equals the snapshot there
        _, f3, _ = _run(DIMS, C, xbc[: r + 1], dt[: r + 1], lg[: r + 1], rec0)
        _same(f3, snaps[r])


def test_batched_and_threads_bitwise() -> None:
    h, p, n, _ = DIMS
    size = sc.record_size(h, p, n, C)
    gen = torch.Generator().manual_seed(5)
    lens = [37, 1, 0, 16, 50, 3]
    starts, alone = [], []
    for z, k in enumerate(lens):  # each sequence from a record made by a random prefix
        pre = int(torch.randint(0, 40, (1,), generator=gen))
        xbc, dt, _, lg = _inputs(DIMS, pre + k, 200 + z)
        _, start, _ = _run(DIMS, C, xbc[:pre], dt[:pre], lg[:pre], torch.zeros(size))
        keep = list(range(0, k, 3))
        y, final, snaps = _run(DIMS, C, xbc[pre:], dt[pre:], lg[pre:], start, keep)
        starts.append(start)
        alone.append((xbc[pre:], dt[pre:], lg[pre:], y, final, keep, snaps))
    order = torch.randperm(len(lens), generator=gen).tolist()  # rows in another order
    xbc = torch.cat([alone[z][0] for z in order])
    dt = torch.cat([alone[z][1] for z in order])
    lg = torch.cat([alone[z][2] for z in order])
    lo, spans = 0, [(0, 0)] * len(lens)
    for z in order:
        spans[z] = (lo, lo + lens[z])
        lo += lens[z]
    threads = torch.get_num_threads()
    try:
        for nt in (1, 2):
            torch.set_num_threads(nt)
            outs = [torch.empty(size) for _ in lens]
            snaps = [[(r, torch.empty(size)) for r in a[5]] for a in alone]
            y = sc.ssd_chunk(xbc, dt, lg, DIMS, spans, starts, outs, snaps, C)
            for z, (a, b) in enumerate(spans):
                _same(y[a:b], alone[z][3])
                _same(outs[z], alone[z][4])
                for (_, got), want in zip(snaps[z], alone[z][6], strict=True):
                    _same(got, want)
    finally:
        torch.set_num_threads(threads)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([((2, 8, 16, 1), 4), ((4, 16, 32, 2), 16), ((3, 5, 13, 3), 1)]),
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9), st.booleans()), max_size=8),
    st.sampled_from([1, 2]),
)
def test_any_calls_same_bits(
    shape: tuple[Dims, int], steps: list[tuple[int, int, bool]], threads: int
) -> None:
    """Two sequences fed by any series of calls (each taking some rows of both, batched,
    records in place or not, 1 or 2 threads) end with the bits of one call each."""
    dims, c = shape
    h, p, n, _ = dims
    total = [sum(a for a, _, _ in steps), sum(b for _, b, _ in steps)]
    seqs = [_inputs(dims, k, 300 + z) for z, k in enumerate(total)]
    rec0 = torch.zeros(sc.record_size(h, p, n, c))
    want = [_run(dims, c, x, d, g, rec0)[:2] for x, d, _, g in seqs]
    recs, ys, done = [rec0.clone(), rec0.clone()], [[], []], [0, 0]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for ka, kb, in_place in steps:
            spans = [(kb, kb + ka), (0, kb)]  # sequence 1's rows first
            pick = [torch.cat([seqs[1][j][done[1] : done[1] + kb],
                               seqs[0][j][done[0] : done[0] + ka]]) for j in (0, 1, 3)]  # fmt: skip
            outs = recs if in_place else [torch.empty_like(r) for r in recs]
            y = sc.ssd_chunk(pick[0], pick[1], pick[2], dims, spans, recs, outs, [[], []], c)
            for z in (0, 1):
                ys[z].append(y[spans[z][0] : spans[z][1]])
                done[z] += (ka, kb)[z]
            recs = outs
    finally:
        torch.set_num_threads(old)
    for z in (0, 1):
        _same(torch.cat([torch.empty(0, h, p), *ys[z]]), want[z][0])
        _same(recs[z], want[z][1])


def test_zero_rows_and_chunk_one() -> None:
    h, p, n, _ = DIMS
    xbc, dt, _, lg = _inputs(DIMS, 9, 3)
    _, rec, _ = _run(DIMS, C, xbc, dt, lg, torch.zeros(sc.record_size(h, p, n, C)))
    y, out, _ = _run(DIMS, C, xbc[:0], dt[:0], lg[:0], rec)
    assert y.shape == (0, h, p)
    _same(out, rec)
    empty = torch.empty(0, xbc.shape[1])  # no storage at all
    y, out, _ = _run(DIMS, C, empty, torch.empty(0, h), torch.empty(0, h), rec)
    _same(out, rec)
    xbc, dt, da, lg = _inputs(DIMS, 20, 4)  # chunk 1: the state itself after every row
    y0, f0, _ = ssm_scan.scan2(xbc, dt, da, DIMS, [(0, 20)], [torch.zeros(h, p, n)], [[]])
    y1, f1, _ = _run(DIMS, 1, xbc, dt, lg, torch.zeros(sc.record_size(h, p, n, 1)))
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5 * y0.abs().max())
    torch.testing.assert_close(f1[:-1].view(h, p, n), f0[0], rtol=1e-5, atol=1e-5)


def test_refuses_bad_arguments() -> None:
    h, p, n, g = DIMS
    size = sc.record_size(h, p, n, C)
    xbc, dt, _, lg = _inputs(DIMS, 5, 6)
    rec, out, big = torch.zeros(size), torch.zeros(size), torch.zeros(2 * size)

    def call(**kw: object) -> torch.Tensor:
        args = {"xbc": xbc, "dt": dt, "lg": lg, "dims": DIMS, "spans": [(0, 5)],
                "rec_in": [rec], "rec_out": [out], "snaps": [[]], "chunk": C}  # fmt: skip
        args.update(kw)
        return sc.ssd_chunk(**args)  # type: ignore[arg-type]

    call()
    for bad in (2.5, float(C), -1.0, float("nan")):
        r = rec.clone()
        r[-1] = bad
        with pytest.raises(ValueError, match="pending-row count"):
            call(rec_in=[r])
        with pytest.raises(ValueError, match="pending-row count"):
            sc.state_of(r, h, p, n, C)
    two = {"rec_in": [rec, rec], "rec_out": [out, torch.zeros(size)], "snaps": [[], []]}
    bad_args: list[dict[str, object]] = [
        {"rec_in": [torch.zeros(size - 1)]},
        {"rec_out": [torch.zeros(size + 1)]},
        {"rec_in": [rec.double()]},
        {"dt": dt[:4]},
        {"lg": lg[:, :3]},
        {"xbc": xbc[:, :-1]},
        {"dims": (3, p, n, 2)},
        {"chunk": 0},
        {"spans": [(0, 6)]},
        {"spans": [(0, 3), (2, 5)], **two},  # overlapping rows
        {"rec_in": [big[:size]], "rec_out": [big[1 : size + 1]]},  # overlapping records
        {"snaps": [[(5, torch.zeros(size))]]},
        {"snaps": [[(2, torch.zeros(size)), (1, torch.zeros(size))]]},
        {"snaps": [[(1, out)]]},
    ]
    for kw in bad_args:
        with pytest.raises(ValueError):
            call(**kw)
    call(rec_out=[rec])  # in place is allowed


def test_c_refuses_corrupt_count() -> None:
    """The kernel itself checks cnt (a caller skipping the wrapper gets -4, not UB)."""
    h, p, n, g = DIMS
    size = sc.record_size(h, p, n, C)
    xbc, dt, _, lg = _inputs(DIMS, 2, 7)
    y = torch.empty(2, h, p)
    lo, cnt, off = (torch.tensor(v, dtype=torch.int64) for v in ([0], [2], [0, 0]))
    for bad, want in ((0.0, 0), (3.0, 0), (2.5, -4), (-1.0, -4), (float(C), -4)):
        rec = torch.zeros(size)
        rec[-1] = bad
        ptr = (ctypes.c_void_p * 1)(rec.data_ptr())
        out = torch.zeros(size)
        optr = (ctypes.c_void_p * 1)(out.data_ptr())
        rc = sc._c().ls_ssd_chunk(  # type: ignore[union-attr]
            1, lo.data_ptr(), cnt.data_ptr(), ptr, optr, xbc.data_ptr(), xbc.stride(0),
            dt.data_ptr(), lg.data_ptr(), y.data_ptr(), h, p, n, g, C, off.data_ptr(),
            off.data_ptr(), (ctypes.c_void_p * 1)(), 1,
        )  # fmt: skip
        assert rc == want
