"""The row-block probe (`bench.chunked_recur_probe`) in place of the engine's scan kernels,
in process, for measuring a whole prefill with it (`bench.chunked_profile --probe`).

`install()` replaces `kernels.deltanet.gdn_recur` and `kernels.ssm_scan.scan2` by wrappers
that run each sequence's rows through the probe in segments ending at its snapshot rows (the
state after a segment is the snapshot, the next segment starts from it): the same arguments,
results and bits (the probe keeps the kernels' float operations; `tests/unit/model/
test_recurrent_chunked.py`), for shapes the probe takes (delta-net S % 64 == 0; Mamba-2 one
group, P % 32 == 0, torch's 8-lane sums); others go to the original kernels. A bench tool:
nothing in the engine imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

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


def install() -> Callable[[], None]:
    """Swap the probe in; returns the function that swaps the original kernels back."""
    from loraserve.kernels import deltanet, ssm_scan

    lib = build()
    gdn0, scan0 = deltanet.gdn_recur, ssm_scan.scan2

    def gdn_recur(spans, m_in, m_out, q, k, v, g, beta, scale, o, snaps) -> None:  # noqa: ANN001
        t, h, s = q.shape
        if s % 64:
            return gdn0(spans, m_in, m_out, q, k, v, g, beta, scale, o, snaps)
        v = v.contiguous()
        for (lo, hi), mi, mo, mine in zip(spans, m_in, m_out, snaps, strict=True):
            cur = mi
            for a, b, e in _segments(hi - lo, [r for r, _ in mine]):
                dst = mine[e][1] if e >= 0 else mo
                lib.probe_gdn(b - a, h, s, cur.data_ptr(), dst.data_ptr(),
                              *(x[lo + a].data_ptr() for x in (q, k, v, g, beta)), scale,
                              o[lo + a].data_ptr(), torch.get_num_threads())  # fmt: skip
                cur = dst
            if cur is not mo:
                mo.copy_(cur)
        return None

    def scan2(xbc, dt, da, dims, spans, states, wanted, finals=None) -> Any:  # noqa: ANN001
        h, p, n, g = dims
        if g != 1 or p % 32 or n % 8 or n // 8 >= 64 or ssm_scan.vector_lanes() != 8:
            return scan0(xbc, dt, da, dims, spans, states, wanted, finals)
        dt, da = dt.contiguous(), da.contiguous()
        y = torch.empty(xbc.shape[0], h, p)
        fin = torch.empty(len(states), h, p, n) if finals is None else finals
        snaps = torch.empty(sum(len(w) for w in wanted), h, p, n)
        at = 0
        for q, ((lo, hi), st, rows) in enumerate(zip(spans, states, wanted, strict=True)):
            cur = st.contiguous()
            for a, b, e in _segments(hi - lo, rows):
                dst = snaps[at + e] if e >= 0 else fin[q]
                lib.probe_ssd(b - a, h, p, n, xbc[lo + a].data_ptr(), xbc.stride(0),
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
