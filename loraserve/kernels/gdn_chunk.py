"""The gated delta rule's chunked form in C (`gdn_chunk.c`): chunks of ``c`` rows aligned to
absolute positions, a state record carrying the state at the last chunk boundary plus the
pending rows of the current chunk, and one kernel for prompt and decode rows whose outputs and
records are the same bits however a sequence's rows are split into calls, batched with other
sequences or threaded. Also the log gates it takes (`log_gates`) and `state_of`, a record's
full state in torch.

Record of one layer for ``h`` value heads of width ``s`` (float32, contiguous)::

    M   [h, s, s]        state at the last chunk boundary, M[h][a][b] (a value, b key index)
    PK  [h, c - 1, s]    keys k_j of the pending rows j < cnt
    PU  [h, c - 1, s]    their u_j (the recurrence's d_j)
    PG  [h, c - 1]       G_j, the sum of the log gates over the chunk's rows 0 .. j
    cnt [1]              the number of pending rows, 0 .. c - 1, as a float

Slots j >= cnt are 0.0 (equal states hash equal); all zeros is the state at position 0."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import torch

from loraserve.cbuild import lazy_bind
from loraserve.kernels import argcheck
from loraserve.kernels.argcheck import int64s, pointers

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "ls_gdn_chunk": (
        [_I, _P, _P, _P, _P, _P, _P, _P, _I, _P, _P, _F, _P, _I, _I, _I, _P, _P, _P, ctypes.c_int],
        ctypes.c_int,
    ),
    "ls_gdn_log_gates": ([_P, _I, _I, _I, _P, _P, _P, _P, _P], ctypes.c_int),
}
MAX_CHUNK = 256  # the C kernel's largest chunk
_c = lazy_bind(_SIGNATURES)


def available() -> bool:
    """Whether the C kernel is built and loaded here."""
    return _c() is not None


def _need() -> ctypes.CDLL:
    lib = _c()
    if lib is None:
        raise RuntimeError("the chunked delta-net C kernel is not built here")
    return lib


def record_size(h: int, s: int, c: int) -> int:
    """Floats in one layer's record for ``h`` heads of width ``s`` and chunk ``c``."""
    return h * s * s + h * (c - 1) * (2 * s + 1) + 1


def scan_size(h: int, s: int, c: int) -> int:
    """Floats of a delta-net layer's scan part of a state record: M [h, s, s] in the recurrent
    form (c = 0); with chunks of c, the carried record (`record_size`), a flag (1.0: the
    recurrence's M follows, live: `chunked.gdn_scan`) and that M."""
    return h * s * s + (record_size(h, s, c) + 1 if c else 0)


def _count(what: str, record: torch.Tensor, c: int) -> int:
    """The pending-row count of ``record``; ValueError unless an integer in 0 .. c - 1."""
    cnt = float(record[-1])
    if not (0 <= cnt <= c - 1 and cnt == int(cnt)):
        raise ValueError(f"{what}: a corrupt record, pending-row count {cnt} for chunk {c}")
    return int(cnt)


def _disjoint(reads: Sequence[torch.Tensor], writes: Sequence[torch.Tensor]) -> None:
    """ValueError when a written tensor's memory overlaps any other record (reads may share;
    a record updated in place is passed as a write only)."""
    spans = sorted((t.data_ptr(), t.data_ptr() + 4 * t.numel(), w)
                   for ts, w in ((reads, False), (writes, True)) for t in ts)  # fmt: skip
    end_any = end_write = 0
    for start, end, write in spans:
        if start < (end_any if write else end_write):
            raise ValueError("gdn_chunk: records overlap (rec_in, rec_out, snapshots)")
        end_any = max(end_any, end)
        end_write = max(end_write, end) if write else end_write


def gdn_chunk(
    spans: Sequence[tuple[int, int]],
    rec_in: Sequence[torch.Tensor],
    rec_out: Sequence[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lg: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    o: torch.Tensor,
    snaps: Sequence[Sequence[tuple[int, torch.Tensor]]],
    chunk: int,
) -> None:
    """Run sequence z's rows ``spans[z]`` = (lo, hi) from record ``rec_in[z]`` into
    ``rec_out[z]`` (``rec_in[z]`` itself: in place): q, k [T, H, S] and o (written)
    contiguous, v [T, H, S] with heads contiguous (any row stride), lg (log gates), beta
    [T, H] contiguous; ``snaps[z]`` lists (row r from lo, ascending; a record to receive the
    record after it). Every record `record_size` (H, S, chunk) contiguous float32, a written
    one sharing memory with no other (reads may share theirs). Raises ValueError for
    arguments that do not fit (a corrupt record's count included), RuntimeError when the
    kernel is not built, MemoryError when it runs out of memory."""
    lib = _need()
    if q.dim() != 3:
        raise ValueError(f"gdn_chunk: q {tuple(q.shape)}, expected [T, H, S]")
    if not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"gdn_chunk: chunk {chunk} outside 1 .. {MAX_CHUNK}")
    t, h, s = q.shape
    for x, shape in ((q, (t, h, s)), (k, (t, h, s)), (o, (t, h, s)), (lg, (t, h)), (beta, (t, h))):
        argcheck.f32(f"gdn_chunk: a tensor of shape {tuple(x.shape)}", x, shape=shape)
    argcheck.f32("gdn_chunk: v", v, shape=(t, h, s), contiguous=False)
    if v.stride()[1:] != (s, 1):
        raise ValueError(f"gdn_chunk: v {tuple(v.shape)} strides {v.stride()}")
    n = record_size(h, s, chunk)
    dsts = [d for z in snaps for _, d in z]
    for x in (*rec_in, *rec_out, *dsts):
        argcheck.f32(f"gdn_chunk: every record must be {n} contiguous float32", x, n)
    argcheck.spans("gdn_chunk", spans, t, rec_in, rec_out, snaps)
    for (lo, hi), z in zip(spans, snaps, strict=True):
        rows = [r for r, _ in z]
        if rows != sorted(rows) or any(not 0 <= r < hi - lo for r in rows):
            raise ValueError(f"gdn_chunk: snapshot rows {rows} for a span of {hi - lo}")
    in_place = [a.data_ptr() == b.data_ptr() for a, b in zip(rec_in, rec_out, strict=True)]
    _disjoint([r for r, ip in zip(rec_in, in_place, strict=True) if not ip], [*rec_out, *dsts])
    off = [0]
    for z in snaps:
        off.append(off[-1] + len(z))
    rc = lib.ls_gdn_chunk(
        len(spans), int64s([lo for lo, _ in spans]), int64s([hi - lo for lo, hi in spans]),
        pointers(rec_in), pointers(rec_out), q.data_ptr(), k.data_ptr(), v.data_ptr(), v.stride(0),
        lg.data_ptr(), beta.data_ptr(), scale, o.data_ptr(), h, s, chunk, int64s(off),
        int64s([r for z in snaps for r, _ in z]), pointers(dsts), torch.get_num_threads(),
    )  # fmt: skip
    if rc == -4:
        for z, rec in enumerate(rec_in):
            _count(f"gdn_chunk: sequence {z}", rec, chunk)
    if rc == -2:
        raise MemoryError("gdn_chunk: out of memory for its work buffers")
    if rc != 0:
        raise ValueError(f"gdn_chunk: sizes that do not fit the C kernel ({rc})")


def log_gates(
    ba: torch.Tensor, cols: torch.Tensor, dt_b: torch.Tensor, a: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """lg = softplus(alpha + dt_b) a and beta = sigmoid(beta logit), [T, H] each, of the rows
    ba [T, W] (unit stride; value head h's beta logit at column cols[h], its alpha at
    cols[H + h], cols int64 [2 H]): `deltanet.gdn_gates`'s arguments, and exp(lg) (libm's
    expf) its g bit for bit."""
    lib = _need()
    argcheck.rows("log_gates: ba", ba, 1)
    t, w = ba.shape
    h = dt_b.numel()
    if cols.numel() != 2 * h or cols.dtype != torch.int64 or cols.device.type != "cpu" \
            or a.numel() != h:  # fmt: skip
        raise ValueError(f"log_gates: rows {tuple(ba.shape)}, {cols.numel()} columns, {h} heads")
    if h and not 0 <= int(cols.min()) <= int(cols.max()) < w:  # C knows the stride, not w
        raise ValueError(f"log_gates: columns {cols.tolist()} outside rows of {w}")
    cols, dt_b, a = cols.contiguous(), dt_b.contiguous(), a.contiguous()
    argcheck.f32("log_gates: dt_b", dt_b, h)
    argcheck.f32("log_gates: a", a, h)
    lg, beta = torch.empty(t, h), torch.empty(t, h)
    ld = ba.stride(0) if t > 1 else w
    rc = lib.ls_gdn_log_gates(ba.data_ptr(), ld, t, h, cols.data_ptr(), dt_b.data_ptr(),
                              a.data_ptr(), lg.data_ptr(), beta.data_ptr())  # fmt: skip
    if rc != 0:
        raise ValueError(f"log_gates: columns {cols.tolist()} outside rows of {w}")
    return lg, beta


def state_of(record: torch.Tensor, h: int, s: int, c: int) -> torch.Tensor:
    """The full state [h, s, s] after a record's pending rows: its boundary state decayed by
    exp(G_last) plus each pending row's exp(G_last - G_j) u_j k_j^T (G_last = G_{cnt-1}), the
    chunk end's formula: elementwise operations in one fixed order (each product rounded,
    the rows added ascending, exp in double), so the bits depend on the record alone, never
    on a batch or the thread count; those of gdn_chunk.c's gc_state_head, where the fused
    decode starts (not the chunk kernel's own end-of-chunk bits). Where a decode row of the
    chunked form starts its recurrence (`chunked.gdn_scan`). ValueError for a corrupt
    count."""
    argcheck.f32("state_of: record", record, record_size(h, s, c))
    cnt = _count("state_of", record, c)
    m0 = record[: h * s * s].view(h, s, s)
    if cnt == 0:
        return m0.clone()
    rest = record[h * s * s : -1]
    pk = rest[: h * (c - 1) * s].view(h, c - 1, s)
    pu = rest[h * (c - 1) * s : 2 * h * (c - 1) * s].view(h, c - 1, s)
    pg = rest[2 * h * (c - 1) * s :].view(h, c - 1).tolist()  # exact, as Python floats
    last = [g[cnt - 1] for g in pg]  # exp in double (libm's, as C's exp), then rounded
    eg = torch.tensor([math.exp(x) for x in last], dtype=torch.float32)  # [h]
    m = m0 * eg.view(h, 1, 1)
    for j in range(cnt):
        dec = torch.tensor([math.exp(x - g[j]) for x, g in zip(last, pg, strict=True)],
                           dtype=torch.float32).view(h, 1)  # fmt: skip
        m += (dec * pu[:, j]).view(h, s, 1) * pk[:, j].view(h, 1, s)
    return m
