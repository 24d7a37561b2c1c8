"""The row-block probe (`bench.chunked_recur_probe`) in place of the engine's scan kernels,
in process, for measuring a whole prefill with it (`bench.chunked_profile --probe`).

`install()` replaces `kernels.deltanet.gdn_recur` and `kernels.ssm_scan.scan2` by wrappers
that run each sequence's rows through the probe in segments ending at its snapshot rows (the
state after a segment is the snapshot, the next segment starts from it): the same arguments,
results and bits (the probe keeps the kernels' float operations; `tests/unit/model/
test_recurrent_chunked.py`), blocks of up to 64 delta-net / 32 Mamba-2 rows (fewer where the
head is narrower); Mamba-2 states other than N % 8 == 0 with torch's 8-lane sums go to the
original kernel. `CALLS` counts both. A bench tool: nothing in the
engine imports it; `python -m pytest -p bench.chunked_probe_pytest ...` runs tests with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bench.chunked_recur_probe import build


def _segments(n: int, rows: list[int]) -> list[tuple[int, int, int]]:
    """Rows 0..n-1 cut after each of `rows` (ascending): (first, last + 1, index in rows or
    -1 for the final segment), empty segments dropped."""
    out, r0 = [], 0
    for e, r in enumerate(rows):
        out.append((r0, r + 1, e))
        r0 = r + 1
    if r0 < n:
        out.append((r0, n, -1))
    return out


CALLS = {
    "gdn probe": 0,
    "gdn original": 0,
    "scan2 probe": 0,
    "scan2 original": 0,
}  # since `install`


def _rows(n: int, most: int) -> int:
    """The largest power of 2 up to `most` that divides n (a block's rows)."""
    r = most
    while n % r:
        r //= 2
    return r


def install() -> Callable[[], None]:
    """Swap the probe in; returns the function that swaps the original kernels back."""
    from loraserve.kernels import deltanet, ssm_scan

    libs: dict[tuple[int, int], Any] = {}

    def lib_for(r: int, rp: int) -> Any:
        if (r, rp) not in libs:
            libs[r, rp] = build(r, rp)
        return libs[r, rp]

    gdn0, scan0 = deltanet.gdn_recur, ssm_scan.scan2

    def gdn_recur(
        spans: list[tuple[int, int]], m_in: list[Tensor], m_out: list[Tensor], q: Tensor,
        k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float, o: Tensor,
        snaps: list[list[tuple[int, Tensor]]],
    ) -> None:  # fmt: skip
        t, h, s = q.shape
        states = [*m_in, *m_out, *(d for z in snaps for _, d in z)]
        fits = (
            all(0 <= lo <= hi <= t for lo, hi in spans)
            and len(spans) == len(snaps)
            and all(x.numel() == h * s * s and x.is_contiguous() for x in states)
            and tuple(o.shape) == (t, h, s)
            and all(
                0 <= r < hi - lo for (lo, hi), z in zip(spans, snaps, strict=False) for r, _ in z
            )
        )
        if not fits:  # the original refuses them (ValueError)
            CALLS["gdn original"] += 1
            return gdn0(spans, m_in, m_out, q, k, v, g, beta, scale, o, snaps)
        CALLS["gdn probe"] += 1
        lib = lib_for(_rows(s, 64), 32)
        q, k, g, beta = (x.contiguous() for x in (q, k, g, beta))
        v = v.contiguous()
        for (lo, hi), mi, mo, mine in zip(spans, m_in, m_out, snaps, strict=True):
            cur, rows = mi, sorted({r for r, _ in mine})  # a row may be asked twice
            for a, b, e in _segments(hi - lo, rows):
                dsts = [d for r, d in mine if r == rows[e]] if e >= 0 else [mo]
                lib.probe_gdn(b - a, h, s, cur.data_ptr(), dsts[0].data_ptr(),
                              *(x[lo + a].data_ptr() for x in (q, k, v, g, beta)), scale,
                              o[lo + a].data_ptr(), torch.get_num_threads())  # fmt: skip
                for d in dsts[1:]:
                    d.copy_(dsts[0])
                cur = dsts[0]
            if cur is not mo:
                mo.copy_(cur)
        return None

    def scan2(
        xbc: Tensor, dt: Tensor, da: Tensor, dims: tuple[int, int, int, int],
        spans: list[tuple[int, int]], states: list[Tensor], wanted: list[list[int]],
        finals: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        h, p, n, g = dims
        t = xbc.shape[0]
        fits = (
            all(0 <= lo <= hi <= t for lo, hi in spans)
            and len(wanted) == len(spans)
            and all(x.numel() == h * p * n for x in states)
            and xbc.stride(-1) == 1
            and xbc.shape[1] >= h * p + 2 * g * n
            and all(
                w == sorted(set(w)) and all(0 <= r < hi - lo for r in w)
                for (lo, hi), w in zip(spans, wanted, strict=False)
            )
        )
        if not fits or h % g or n % 8 or n // 8 >= 64 or ssm_scan.vector_lanes() != 8:
            CALLS["scan2 original"] += 1
            return scan0(xbc, dt, da, dims, spans, states, wanted, finals)
        CALLS["scan2 probe"] += 1
        lib = lib_for(64, _rows(p, 32))
        dt, da = dt.contiguous(), da.contiguous()
        y = torch.empty(xbc.shape[0], h, p)
        fin = torch.empty(len(states), h, p, n) if finals is None else finals
        snaps = torch.empty(sum(len(w) for w in wanted), h, p, n)
        at = 0
        for q, ((lo, hi), st, rows) in enumerate(zip(spans, states, wanted, strict=True)):
            cur = st.contiguous()
            for a, b, e in _segments(hi - lo, rows):
                dst = snaps[at + e] if e >= 0 else fin[q]
                lib.probe_ssd(b - a, h, p, n, g, xbc[lo + a].data_ptr(), xbc.stride(0),
                              dt[lo + a].data_ptr(), da[lo + a].data_ptr(), cur.data_ptr(),
                              dst.data_ptr(), y[lo + a].data_ptr(),
                              torch.get_num_threads())  # fmt: skip
                cur = dst
            if cur.data_ptr() != fin[q].data_ptr():
                fin[q].copy_(cur)
            at += len(rows)
        return y, fin, snaps

    deltanet.gdn_recur, ssm_scan.scan2 = gdn_recur, scan2  # type: ignore[assignment]

    def undo() -> None:
        deltanet.gdn_recur, ssm_scan.scan2 = gdn0, scan0  # type: ignore[assignment]

    return undo
