"""The chunked (SSD) form of Mamba-2's selective scan in C (`ssd_chunk.c`): chunks of ``c``
rows aligned to each sequence's absolute positions 0, c, 2c, ...; a sequence's state record
carries the state at its last chunk boundary plus the pending rows of the current chunk, so a
prompt's rows and decode rows run the same fixed operations, and a sequence's outputs, records
and snapshots are the same bits however its rows are split into calls, batched with other
sequences, or threaded (docs/chunked_scan.md, "Can a chunked form keep the numerics
contract?"). The D skip, z gate and norm stay outside, as with `ssm_scan.scan2`.

Record (float32, contiguous, `record_size` values; all zeros = the state at position 0):
s [H, P, N] (boundary state), PX [H, c-1, P] (x dt of the pending rows), PB [H, c-1, N]
(their B), PG [H, c-1] (running sums of lg = dt A over the chunk's rows), cnt [1] (how many
rows are pending, 0..c-1); slots past cnt are 0.0."""

from __future__ import annotations

import bisect
import ctypes
from collections.abc import Sequence

import torch

from loraserve.cbuild import lazy_bind
from loraserve.kernels import argcheck

_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "ls_ssd_chunk": (
        [_I, _P, _P, _P, _P, _P, _I, _P, _P, _P] + [_I] * 5 + [_P] * 3 + [ctypes.c_int],
        ctypes.c_int,
    ),
}
_MAX_CHUNK = 4096  # SSD_MAX_C
_c = lazy_bind(_SIGNATURES)


def available() -> bool:
    """Whether the C chunked scan can run here (the kernels library is built)."""
    return _c() is not None


def record_size(h: int, p: int, n: int, c: int) -> int:
    """Floats in one layer's scan record for h heads of state [p, n] and chunk c."""
    return h * p * n + h * (c - 1) * (p + n + 1) + 1


def _parts(rec: torch.Tensor, h: int, p: int, n: int, c: int) -> tuple[torch.Tensor, ...]:
    """Views (s [H, P, N], PX [H, c-1, P], PB [H, c-1, N], PG [H, c-1], cnt [1]) of a record."""
    sizes = (h * p * n, h * (c - 1) * p, h * (c - 1) * n, h * (c - 1), 1)
    s, px, pb, pg, cnt = rec.split(sizes)
    return s.view(h, p, n), px.view(h, c - 1, p), pb.view(h, c - 1, n), pg.view(h, c - 1), cnt


def _count(what: str, rec: torch.Tensor, c: int) -> int:
    """The record's pending-row count, ValueError unless it is an integer in 0..c-1."""
    v = float(rec[-1])
    if not (0.0 <= v <= c - 1 and v == int(v)):
        raise ValueError(f"{what}: corrupt record, pending-row count {v} not in 0..{c - 1}")
    return int(v)


def state_of(record: torch.Tensor, h: int, p: int, n: int, c: int) -> torch.Tensor:
    """The full state [H, P, N] after a record's pending rows (the chunk-end formula with
    G_last = G_{cnt-1}, in torch; not the kernel's bits): what the recurrence would hold."""
    argcheck.f32("state_of: record", record, record_size(h, p, n, c))
    s, px, pb, pg, _ = _parts(record, h, p, n, c)
    k = _count("state_of", record, c)
    if k == 0:
        return s.clone()
    last = pg[:, k - 1]  # [H]
    e = torch.exp(last[:, None] - pg[:, :k])  # [H, k]
    upd = torch.einsum("hj,hjp,hjn->hpn", e, px[:, :k], pb[:, :k])
    return torch.exp(last)[:, None, None] * s + upd


def _pointers(what: str, recs: Sequence[torch.Tensor], size: int) -> list[int]:
    """The records' data pointers, each checked to be contiguous CPU float32 of ``size``."""
    out = []
    for rec in recs:
        ok = isinstance(rec, torch.Tensor) and rec.dtype == torch.float32 and rec.is_cpu
        if not (ok and rec.numel() == size and rec.is_contiguous()):
            argcheck.f32(f"{what}: records of {size} contiguous floats needed", rec, size)
        out.append(rec.data_ptr())
    return out


def _disjoint(what: str, outs: list[int], ins: list[int], nbytes: int) -> None:
    """ValueError unless the records written (outs: rec_out, then snapshots; nbytes each)
    meet no other record given, except rec_out[z] being rec_in[z] (updated in place)."""
    so = sorted(outs)
    if any(b - a < nbytes for a, b in zip(so, so[1:], strict=False)):
        raise ValueError(f"{what}: records and snapshots written must not overlap")
    for z, q in enumerate(ins):
        i = bisect.bisect_right(so, q - nbytes)
        while i < len(so) and so[i] < q + nbytes:
            if so[i] != q or outs[z] != q:
                raise ValueError(f"{what}: a record read overlaps another sequence's written")
            i += 1


def _index(values: list[int]) -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * max(1, len(values)))(*values)


def ssd_chunk(
    xbc: torch.Tensor,
    dt: torch.Tensor,
    lg: torch.Tensor,
    dims: tuple[int, int, int, int],
    spans: Sequence[tuple[int, int]],
    rec_in: Sequence[torch.Tensor],
    rec_out: Sequence[torch.Tensor],
    snaps: Sequence[Sequence[tuple[int, torch.Tensor]]],
    chunk: int,
) -> torch.Tensor:
    """The chunked scan of a step's rows: xbc [T, >= H P + 2 G N] (x [H, P], B, C [G, N] per
    row; float32, unit stride), dt [T, H] (softplus'd) and lg [T, H] (dt * A), dims (H, P, N,
    G); sequence z owns rows spans[z] = (lo, hi), starts from record rec_in[z] (not
    modified) and leaves its record in rec_out[z] (the same tensor or disjoint memory);
    snaps[z]: (local row r, record tensor) pairs, r ascending, each given the record after
    row r. Records are contiguous float32 of `record_size`. -> y [T, H, P]."""
    lib = _c()
    if lib is None:
        raise RuntimeError("the C chunked scan is not available here")
    h, p, n, g = dims
    if min(dims) < 1 or h % g != 0:
        raise ValueError(f"ssd_chunk: dims {dims}")
    if not isinstance(chunk, int) or not 1 <= chunk <= _MAX_CHUNK:
        raise ValueError(f"ssd_chunk: chunk {chunk} outside 1..{_MAX_CHUNK}")
    width = h * p + 2 * g * n
    argcheck.rows("ssd_chunk: xbc must be float32 rows of unit stride", xbc, width)
    t = xbc.shape[0]
    dt, lg = dt.contiguous(), lg.contiguous()
    argcheck.spans("ssd_chunk", spans, t, rec_in, rec_out, snaps)
    argcheck.f32("ssd_chunk: dt", dt, shape=(t, h))
    argcheck.f32("ssd_chunk: lg", lg, shape=(t, h))
    size = record_size(h, p, n, chunk)
    p_in = _pointers("ssd_chunk: rec_in", rec_in, size)
    same = all(a is b for a, b in zip(rec_out, rec_in, strict=True))
    p_out = list(p_in) if same else _pointers("ssd_chunk: rec_out", rec_out, size)
    ordered = sorted((lo, hi) for lo, hi in spans if hi > lo)
    if any(b[0] < a[1] for a, b in zip(ordered, ordered[1:], strict=False)):
        raise ValueError(f"ssd_chunk: row spans {list(spans)} overlap")
    rows, ptrs, off = [], [], [0]
    for (lo, hi), kept in zip(spans, snaps, strict=True):
        last = -1
        for r, rec in kept:
            if not isinstance(r, int) or not last < r < hi - lo:
                raise ValueError(f"ssd_chunk: snapshot rows must ascend within 0..{hi - lo - 1}")
            rows.append(r)
            ptrs.append(rec)
            last = r
        off.append(len(rows))
    p_snap = _pointers("ssd_chunk: snapshots", ptrs, size)
    _disjoint("ssd_chunk", p_out + p_snap, p_in, 4 * size)
    y = torch.empty(t, h, p)
    k = len(spans)
    if k == 0:
        return y
    ldx = xbc.stride(0) if t > 1 else width
    rc = lib.ls_ssd_chunk(
        k, _index([a for a, _ in spans]), _index([b - a for a, b in spans]),
        (ctypes.c_void_p * k)(*p_in), (ctypes.c_void_p * k)(*p_out), xbc.data_ptr(), ldx,
        dt.data_ptr(), lg.data_ptr(), y.data_ptr(), h, p, n, g, chunk, _index(off), _index(rows),
        (ctypes.c_void_p * max(1, len(p_snap)))(*p_snap), torch.get_num_threads(),
    )  # fmt: skip
    if rc == -4:  # checked in C before anything was written: name the record
        for z, rec in enumerate(rec_in):
            _count(f"ssd_chunk: rec_in[{z}]", rec, chunk)
    if rc == -2:
        raise MemoryError("ssd_chunk: out of memory for its work buffers")
    if rc != 0:
        raise ValueError(f"ssd_chunk: sizes that do not fit the C kernel ({rc})")
    return y
