"""State records of the recurrent layers' steps: their memory (`POOL`), a decode step's new
records (`fresh_records`, `decode_records` for the fused C layers, `is_decode_step`) and a
multi-row step's snapshot records (`cut_records`).

Memory for decode steps' new state records is reused once nothing holds a record any more.
A decode step makes one new state record per recurrent layer and sequence
(`fresh_records`): 1.6 MB (granitehybrid) to 2.2 MB (qwen35) each on the bench models,
a whole snapshot's worth per step. Each drops out of the sequence's live states two steps
later. Made with `torch.empty` every step, glibc's heap grew by a step's records and, as
they were freed, trimmed its top back past its trim threshold: on the qwen35 bench model
~3,200 page faults (every new page zeroed) every third decode step or so, such a step 4-10 ms
slower than the others (1 thread, thread CPU). The pool keeps, per key, the storages of the
records it handed out lately and hands one out again when nothing else refers to its memory
(no tensor, view or storage object: `torch._C._storage_Use_Count` is 1, the pool's own
reference), so a step reuses the pages of the records the step before last dropped.

A reused record's values are whatever it held, as `torch.empty`'s are: every writer of a
new record writes all of it. A record a snapshot, checkpoint or live state still holds is
never handed out. The pool keeps at most ``slack`` times the last request's count per key
(older entries are forgotten: freed with their last reference, as before)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Hashable
from typing import Any

import torch

from loraserve.cache.state_records import SeqStep
from loraserve.kernels import ssm_scan

_use_count = getattr(torch._C, "_storage_Use_Count", None)


class RecordPool:
    """Float32 records of a fixed size per key, their memory reused when free."""

    def __init__(self, slack: int = 4) -> None:
        self.slack = slack
        # (key, size) -> the storages of the records handed out, the latest last
        self._rings: dict[tuple[Hashable, int], list[torch.UntypedStorage]] = {}
        self._lock = threading.Lock()  # engines on other threads share the pool

    def take(self, key: Hashable, size: int, n: int) -> list[torch.Tensor]:
        """n records [size] float32 (contents unspecified) for ``key`` (one recurrent layer):
        on the storages of free records the pool handed out under ``key`` and size before,
        oldest first, then new ones."""
        if _use_count is None:
            return [torch.empty(size) for _ in range(n)]
        with self._lock:
            ring = self._rings.setdefault((key, size), [])
            idx: list[int] = []  # the free ones, oldest first
            for j in range(len(ring)):
                if _free(ring, j):
                    idx.append(j)
                    if len(idx) == n:
                        break
            got = [ring[j] for j in idx]
            for j in reversed(idx):
                del ring[j]
            out = [torch.empty(0).set_(s, 0, (size,), (1,)) for s in got]
            for _ in range(n - len(got)):
                t = torch.empty(size)
                got.append(t.untyped_storage())
                out.append(t)
            ring += got  # the latest last
            if len(ring) > self.slack * n:
                del ring[: len(ring) - self.slack * n]  # the oldest forgotten
        return out

    def held(self, key: Hashable, size: int) -> int:
        """How many storages the pool keeps under ``key`` and ``size`` (free or not)."""
        return len(self._rings.get((key, size), ()))


def _refs(ring: list[torch.UntypedStorage], j: int) -> int:
    """The reference count of the storage object ``ring[j]`` as seen from here."""
    s = ring[j]
    return sys.getrefcount(s)


# what `_refs` sees for a storage nothing but its list holds, measured rather than assumed
# (interpreters count temporaries differently: 3.14 borrows stack references)
_ALONE = _refs([torch.empty(1).untyped_storage()], 0)


def _free(ring: list[torch.UntypedStorage], j: int) -> bool:
    """Whether nothing but the pool's list refers to storage ``ring[j]``: no tensor or view
    (the storage's use count is the pool's object's alone) and no other reference to that
    object (torch hands the same Python object to every ``untyped_storage()`` while it
    lives)."""
    return _use_count(ring[j]._cdata) == 1 and _refs(ring, j) <= _ALONE  # type: ignore[misc]


POOL = RecordPool()


def cut_records(
    i: int, seq: SeqStep, xpad: torch.Tensor, k: int, n_conv: int, size: int, out: torch.Tensor
) -> list[tuple[int, torch.Tensor]]:
    """The snapshot records layer ``i`` writes for ``seq`` (every row of a draft, else its
    cuts), their conv rows filled from ``xpad``: (row, scan part) pairs for the kernel. A cut
    at the last row is the new record ``out`` itself (never changed in place)."""
    rows = seq.hi - seq.lo
    cuts, mine = dict(seq.cuts), []
    if not seq.every and rows - 1 in cuts:
        seq.snaps.setdefault(cuts.pop(rows - 1), {})[i] = out
    for r in range(rows) if seq.every else sorted(c for c in cuts if c < rows):
        snap = torch.empty(size)
        snap[:n_conv] = xpad[r + 1 : r + k].reshape(-1)
        mine.append((r, snap[n_conv:]))
        if r in cuts:
            seq.snaps.setdefault(cuts[r], {})[i] = snap
        if seq.every:  # a draft's rows: the state after each (rollback)
            seq.rows.setdefault(i, []).append(snap)
    return mine


def fresh_records(
    i: int, size: int, seqs: list[SeqStep], shape: tuple[int, ...] | None = None
) -> list[torch.Tensor]:
    """The new state records [size] (or views of them in ``shape``) of recurrent layer i for a
    decode step of ``seqs`` (one new row each): made each sequence's state after its row and,
    where a block ends with the row, that block's snapshot (the same values, never changed).
    Their memory is that of free records of the layer when there are (`records.POOL`: no
    page faults)."""
    recs = POOL.take((i, size), size, len(seqs))
    if shape is not None:
        recs = [r.view(shape) for r in recs]
    for seq, rec in zip(seqs, recs, strict=True):
        seq.out[i] = rec
        for r, block in seq.cuts:
            if r == 0:
                seq.snaps.setdefault(block, {})[i] = rec
    return recs


def is_decode_step(seqs: list[SeqStep] | None, t: int, sampled: bool = False) -> bool:
    """Whether a step of t rows is one new row per sequence, row q sequence q's (decode
    steps, no draft rows): the case `Mamba2._step` and the fused C layers run. ``sampled``:
    each row also one the engine sampled (`SeqStep.decode`: `--scan-form chunked`'s
    delta-net decodes those rows alone by its recurrence)."""
    return (
        seqs is not None
        and len(seqs) == t
        and ssm_scan.available()
        and all((q.lo, q.hi) == (r, r + 1) and not q.every for r, q in enumerate(seqs))
        and (not sampled or all(q.decode for q in seqs))
    )


def decode_records(
    mixers: list[Any], seqs: list[SeqStep] | None, t: int
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]] | None:
    """A decode step's state records for the fused C layers: (before, after) lists of
    [n_layers * t], entry i * t + q sequence q's at layer i (None where the layer has no
    recurrent mixer: ``mixers[i]`` None, or a mixer with ``i``, ``state_size`` and, where its
    records have a shape, ``record_shape``); the new records are made each sequence's output
    states (`new_records`).
    None where the step is not a decode step (the per-layer path runs it)."""
    if not is_decode_step(seqs, t, any(getattr(m, "chunk", 0) for m in mixers if m is not None)):
        return None
    assert seqs is not None
    ins: list[torch.Tensor | None] = []
    outs: list[torch.Tensor | None] = []
    for m in mixers:
        if m is None:
            ins += [None] * t
            outs += [None] * t
        else:
            ins += [s.state[m.i] for s in seqs]
            shape = m.record_shape() if hasattr(m, "record_shape") else None
            outs += fresh_records(m.i, m.state_size, seqs, shape)  # m.new_records(seqs)
    return ins, outs
