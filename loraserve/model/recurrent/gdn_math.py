"""Gated delta-net's per-token maths in torch, the reference path (no C kernels, one value
head): the gates of a row and the recurrence that `kernels.deltanet.gdn_recur` equals bit for
bit. (The C paths' gates are `kernels.deltanet.gdn_gates`, each value alone in libm.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gate_row(
    alpha: torch.Tensor, beta: torch.Tensor, dt_b: torch.Tensor, a: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's decay g = exp(softplus(alpha + dt_b) a) and beta = sigmoid(beta logit):
    alpha, beta [H_v] -> [H_v] each. torch's vectorized exp, softplus and sigmoid round
    differently from their scalar tails, so where an element sits in the row decides its bits:
    the reference computes each row alone."""
    return torch.exp(F.softplus(alpha + dt_b) * a), torch.sigmoid(beta)


def recur_torch(
    spans: list[tuple[int, int]],
    m_in: list[torch.Tensor],
    m_out: list[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: torch.Tensor,
    o: torch.Tensor,
    snaps: list[list[tuple[int, torch.Tensor]]],
) -> None:
    """The recurrence in torch, token by token (the reference `kernels.deltanet.gdn_recur`
    must equal bit for bit; same arguments, ``scale`` a float32 0-d tensor)."""
    hv, s = q.shape[1], q.shape[2]
    for (lo, hi), mi, mo, mine in zip(spans, m_in, m_out, snaps, strict=True):
        m = mi.view(hv, s, s)  # [H_v, S (value), S (key)]
        want = dict.fromkeys(r for r, _ in mine)
        for r in range(hi - lo):
            row = lo + r
            kr = k[row].unsqueeze(-1)  # [H_v, S, 1]
            m = m * g[row].view(hv, 1, 1)
            d = (v[row] - torch.bmm(m, kr).squeeze(-1)) * beta[row].view(hv, 1)  # [H_v, S]
            m = m + d.unsqueeze(-1) * k[row].unsqueeze(1)
            o[row] = torch.bmm(m, q[row].unsqueeze(-1)).squeeze(-1) * scale
            if r in want:
                for rr, dst in mine:
                    if rr == r:
                        dst.copy_(m.reshape(-1))
        mo.copy_(m.reshape(-1))
