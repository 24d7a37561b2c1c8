"""The chunked form of the delta-net and Mamba-2 scans (`--scan-form chunked`).

The recurrent form (the default) runs a state token by token. The chunked form cuts each
sequence into chunks of ``CHUNK`` positions at absolute positions 0, C, 2C, ... and computes a
row from the state at its chunk's start plus the rows of the chunk before it (the delta rule's
UT transform by forward substitution; Mamba-2's state-space dual form), the state itself only
moving at a chunk's end (`kernels/gdn_chunk.c`, `kernels/ssd_chunk.c`).

To keep the numerics contract, a state record in this form is *carried*: the state at the
last chunk boundary, then the pending rows since (delta-net: k, u and the running log decay
per row and head; Mamba-2: x dt, B and the running log decay), then their count. Every row,
prompt or decode, runs the same kernel on that record, one row at a time or many, so a row's
bits depend only on its sequence's tokens: the same alone, batched, in prefill pieces cut
anywhere (inside a chunk too), one decode row at a time, resumed from a snapshot, a
checkpoint or a restored slot, and rolled back after a rejected draft. The records are larger
(`gdn_chunk.record_size`, `ssd_chunk.record_size`: +24% and +37% at the bench shapes with
C = 16) and snapshots with them; the cache, slots and drafts handle them as any record. The
C decode steps and the fused C layers run the recurrent form only, so in this form these
layers decode on the per-layer path. docs/chunked_scan.md measures both forms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from loraserve.cache.state_records import SeqStep
from loraserve.kernels import gdn_chunk, ssd_chunk
from loraserve.model.recurrent.records import cut_records

if TYPE_CHECKING:
    from loraserve.model.recurrent.mamba2 import Mamba2

CHUNK = 16  # positions per chunk: the default block size, so block-end records pend no rows


def require() -> None:
    """Raise ValueError where the chunked kernels are not built here (the form has no torch
    fallback)."""
    if not (gdn_chunk.available() and ssd_chunk.available()):
        raise ValueError("--scan-form chunked needs the C kernels, which are not built here")


def ssd_scan(
    m: Mamba2,
    seqs: list[SeqStep],
    xbc: torch.Tensor,
    dt: torch.Tensor,
    pads: list[torch.Tensor],
    spans: list[tuple[int, int]],
) -> torch.Tensor:
    """Mamba-2 mixer ``m``'s scan of every sequence in the chunked form (`kernels.ssd_chunk`):
    writes each sequence's new state record [conv rows | carried scan record] and its
    snapshots (as the recurrent form does); -> y [T, H, P]. xbc [T, conv_dim] after the conv,
    dt [T, H] (`ssm_scan.dt_da`), pads: each sequence's conv input (its state's conv rows,
    then its rows)."""
    h, n, k = m.h, m.n, m.k
    n_conv = (k - 1) * m.conv_dim
    lg = dt * m.a  # [T, H] log decays: one rounded product each, the same bits in any batch
    rec_in, rec_out, snaps = [], [], []
    for seq, xpad in zip(seqs, pads, strict=True):
        rows = seq.hi - seq.lo
        rec_in.append(seq.state[m.i][n_conv:])
        seq.out[m.i] = out = torch.empty(m.state_size)
        out[:n_conv] = xpad[rows:].reshape(-1)
        rec_out.append(out[n_conv:])
        snaps.append(cut_records(m.i, seq, xpad, k, n_conv, m.state_size, out))
    return ssd_chunk.ssd_chunk(xbc, dt, lg, (h, m.d_inner // h, n, m.g), spans, rec_in,
                               rec_out, snaps, m.chunk)  # fmt: skip
