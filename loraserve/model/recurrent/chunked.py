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
C = 16) and snapshots with them; the cache, slots and drafts handle them as any record.
Mamba-2's C decode step and fused layers run the recurrent form only, so in this form its
layers decode on the per-layer path. docs/chunked_scan.md measures both forms.

The delta-net decodes in the recurrent form all the same (issue 28: "its chunked form for
prompts and the recurrent form for decode"; `gdn_scan`): its record also carries the
recurrence's state M, live from a sequence's first decode row (the prompt's chunked state,
`gdn_chunk.state_of`) and kept by every decode and draft row, while the chunked record beside
it goes on as above, so what a prompt resumes from is exact in the chunked form whichever step
made it (a decode's too: a chat's next turn) and a decode row's bits are the recurrence's.
The C decode step and the fused C layers do the same (`deltanet_step.h`: `ls_gdn_chunk` for
the record, `gc_state_head` for the first decode row's state, the bits of `state_of`), so
the delta-net decodes in the fused layers in this form too.
Mamba-2 (chunked for prompts in the issue, nothing said of decode) runs its chunked form for
every row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from loraserve.cache.state_records import SeqStep
from loraserve.kernels import gdn_chunk, ssd_chunk
from loraserve.model.recurrent.records import cut_records

if TYPE_CHECKING:
    from loraserve.model.recurrent.deltanet import GatedDeltaNet
    from loraserve.model.recurrent.mamba2 import Mamba2

Cuts = list[list[tuple[int, torch.Tensor]]]  # per sequence: (row, record) snapshots

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


def gdn_scan(
    m: GatedDeltaNet,
    seqs: list[SeqStep],
    spans: list[tuple[int, int]],
    m_in: list[torch.Tensor],
    m_out: list[torch.Tensor],
    snaps: Cuts,
    rows: tuple[torch.Tensor, ...],
    recur: Callable[[list[tuple[int, int]], list[torch.Tensor], list[torch.Tensor], Cuts], None],
) -> None:
    """Delta-net mixer ``m``'s scan in this form: the chunked form for every row (the carried
    records, which snapshots, checkpoints and slots keep and every prompt resumes from), and
    for rows the engine sampled (``seq.decode``: decode and draft rows) the recurrent form,
    whose outputs replace the chunked ones. Scan parts (`gdn_chunk.scan_size`) ``m_in`` (read),
    ``m_out`` and the snapshots' (written); rows = (q, k, v, ba, alpha and beta logits, o) of
    the step; ``recur`` runs the recurrent form (spans, M in, M out, snapshots), o's rows.

    A sequence's decode starts its recurrence from the state after its prompt in the chunked
    form (`gdn_chunk.state_of` of the record, where the flag says no live M follows it: the
    step before was a prompt's) and carries M in its records from then on, so its outputs are
    the recurrence's from that state, the same bits alone, batched and speculated (a draft's
    rows keep M each). A prompt row never reads M (nor do the snapshots a prompt resumes
    from: a prompt's step writes flag 0 and zeros), so every prompt's bits stay those of its
    tokens' chunked form, whichever request's decode made the record it resumes from."""
    q, kk, v, ba, _, _, o = rows
    h, s, c = m.hv, m.s, m.chunk
    rs = gdn_chunk.record_size(h, s, c)
    lg, beta = gdn_chunk.log_gates(ba, m.ba_cols, m.dt_b, m.a)  # log decays
    gdn_chunk.gdn_chunk(spans, [x[:rs] for x in m_in], [x[:rs] for x in m_out], q, kk, v, lg,
                        beta, m.inv_f, o, [[(r, d[:rs]) for r, d in z] for z in snaps],
                        c)  # fmt: skip
    dec = [z for z, seq in enumerate(seqs) if seq.decode]
    for z, seq in enumerate(seqs):
        for x in (m_out[z], *(d for _, d in snaps[z])):
            x[rs] = 1.0 if seq.decode else 0.0
            if not seq.decode:
                x[rs + 1 :].zero_()  # no live M: equal records hash equal
    if not dec:
        return
    live = [
        m_in[z][rs + 1 :] if float(m_in[z][rs]) == 1.0
        else gdn_chunk.state_of(m_in[z][:rs], h, s, c).reshape(-1)
        for z in dec
    ]  # fmt: skip
    recur([spans[z] for z in dec], live, [m_out[z][rs + 1 :] for z in dec],
          [[(r, d[rs + 1 :]) for r, d in snaps[z]] for z in dec])  # fmt: skip
