"""Chunked forms of the gated delta rule and the Mamba-2 scan in torch float32 (a prototype).

Parallel within a chunk; `bench.chunked_scan` measures them against our token-by-token
C kernels (`kernels/deltanet.c`, `kernels/ssm_scan.c`). Written from the public maths (the
WY/UT transform of the delta rule, "Gated Delta Networks", Yang et al. 2024; Mamba-2's SSD,
Dao and Gu 2024); not used by the engine.

Gated delta rule, per value head, state M [S_v, S_k] (ours: `kernels.deltanet`):

    M_t = g_t M_{t-1} + d_t k_t^T,  d_t = beta_t (v_t - g_t M_{t-1} k_t),  o_t = scale M_t q_t

Inside a chunk starting from M0, with G_i = sum_{j<=i} log g_j and D_ij = exp(G_i - G_j), the
d's (here u) solve a unit lower-triangular system (the UT transform):

    u_i + beta_i sum_{j<i} D_ij (k_i.k_j) u_j = beta_i (v_i - exp(G_i) M0 k_i)
    o_i = scale (exp(G_i) M0 q_i + sum_{j<=i} D_ij (q_i.k_j) u_j)
    M_C = exp(G_C) M0 + sum_j exp(G_C - G_j) u_j k_j^T

Mamba-2, per head, state s [P, N]: s_t = a_t s_{t-1} + (x_t dt_t) B_t^T, y_t = s_t C_t; in a
chunk with G_i = sum_{j<=i} log a_j (= dt_j A), L_ij = exp(G_i - G_j):

    y_i = exp(G_i) s0 C_i + sum_{j<=i} L_ij (C_i.B_j) dt_j x_j,
    s_C = exp(G_C) s0 + sum_j exp(G_C - G_j) dt_j x_j B_j^T

Both `*_chunk` functions take one chunk of a fixed C rows (a partial chunk: zero rows after
its n valid ones) for a batch of heads, so every op has the same shapes whatever the prompt's
length, its chunking or the rows that follow: the basis of the prefix-consistency test.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _decay(gcum: torch.Tensor) -> torch.Tensor:
    """gcum [B, C] (cumulative log decay) -> D [B, C, C], D_ij = exp(G_i - G_j) for j <= i,
    exactly 0 above the diagonal (masked before exp: no overflow)."""
    c = gcum.shape[-1]
    diff = gcum.unsqueeze(-1) - gcum.unsqueeze(-2)  # [B, C, C]
    mask = torch.ones(c, c, dtype=torch.bool).tril()
    return torch.exp(diff.masked_fill(~mask, float("-inf")))


def _cum_decays(logd: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """logd [..., C] (log decays of a chunk's rows) -> (G = their running sum [..., C],
    exp(G) [..., C, 1], exp(G_C - G) [..., C, 1], exp(G_C) [..., 1, 1])."""
    gcum = torch.cumsum(logd, dim=-1)
    last = gcum[..., -1:]
    return (gcum, torch.exp(gcum).unsqueeze(-1), torch.exp(last - gcum).unsqueeze(-1),
            torch.exp(last).unsqueeze(-1))  # fmt: skip


def unit_lower_inverse(lmat: torch.Tensor) -> torch.Tensor:
    """(I + L)^-1 for strictly lower-triangular L [B, C, C] (C a power of 2): L is nilpotent,
    so the inverse is (I - L)(I + L^2)(I + L^4)...(I + L^(C/2)), log2(C) squarings; for
    C = 16 several times faster than a batched triangular solve here."""
    eye = torch.eye(lmat.shape[-1])
    inv, p = eye - lmat, lmat
    for _ in range(max(0, lmat.shape[-1].bit_length() - 2)):
        p = torch.bmm(p, p)  # L^(2^i)
        inv = torch.bmm(inv, eye + p)
    return inv


def gdn_intra(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    logg: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The state-free part of B chunks of the gated delta rule, all at once: q, k [B, C, S_k],
    v [B, C, S_v], logg, beta [B, C] (log of the decay, the write strength; padding rows all
    0). -> (U [B, C, S_v], W [B, C, S_k] with u = U - W M0^T; QK [B, C, C] the decayed causal
    q.k; exp(G) [B, C, 1]; exp(G_C - G) [B, C, 1]; exp(G_C) [B, 1, 1])."""
    c = q.shape[1]
    gcum, eg, tail, elast = _cum_decays(logg)  # [B, C], [B, C, 1], [B, C, 1], [B, 1, 1]
    dmat = _decay(gcum)  # [B, C, C]
    kk = torch.bmm(k, k.transpose(1, 2))  # [B, C, C]
    strict = torch.ones(c, c, dtype=torch.bool).tril(-1)
    lmat = (beta.unsqueeze(-1) * dmat * kk).masked_fill(~strict, 0.0)  # strictly lower
    bv = beta.unsqueeze(-1)  # [B, C, 1]
    rhs = torch.cat((bv * v, bv * eg * k), dim=-1)  # [B, C, S_v + S_k]
    sol = torch.bmm(unit_lower_inverse(lmat), rhs)  # (I + L)^-1 rhs
    sv = v.shape[-1]
    qk = torch.bmm(q, k.transpose(1, 2)) * dmat  # [B, C, C], j <= i (D is 0 above)
    return sol[..., :sv], sol[..., sv:], qk, eg, tail, elast


def gdn_pass(m0: torch.Tensor, q: torch.Tensor, k: torch.Tensor, intra: tuple,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """One chunk from state m0 [B, S_v, S_k] with its `gdn_intra` parts (q, k [B, C, S_k]):
    -> (o [B, C, S_v], M after the chunk's last row)."""
    uu, ww, qk, eg, tail, elast = intra
    c = q.shape[1]
    wq = torch.bmm(torch.cat((ww, q), dim=1), m0.transpose(1, 2))  # [B, 2C, S_v]: W, Q M0^T
    u = uu - wq[:, :c]  # [B, C, S_v]
    o = torch.baddbmm(eg * wq[:, c:], qk, u) * scale
    return o, torch.baddbmm(elast * m0, (u * tail).transpose(1, 2), k)


def gdn_chunk(
    m0: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    logg: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the gated delta rule for B (sequence, head) pairs: m0 [B, S_v, S_k],
    the rest as `gdn_intra`. -> (o [B, C, S_v], M after the chunk's last row)."""
    return gdn_pass(m0, q, k, gdn_intra(q, k, v, logg, beta), scale)


def ssd_intra(
    xdt: torch.Tensor, b: torch.Tensor, cm: torch.Tensor, loga: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The state-free part of B chunks of the Mamba-2 scan: xdt [B, C, P] (x dt); b, cm
    [B, C, N] (the head's group's B and C rows); loga [B, C] (dt A; padding rows all 0).
    -> (the chunk's own y [B, C, P], exp(G) [B, C, 1], C rows, B rows, (x dt) exp(G_C - G)
    [B, C, P], exp(G_C) [B, 1, 1])."""
    gcum, eg, tail, elast = _cum_decays(loga)  # [B, C], [B, C, 1], [B, C, 1], [B, 1, 1]
    lmat = _decay(gcum) * torch.bmm(cm, b.transpose(1, 2))  # [B, C, C]
    return torch.bmm(lmat, xdt), eg, cm, b, xdt * tail, elast


def ssd_pass(s0: torch.Tensor, intra: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk from state s0 [B, P, N] with its `ssd_intra` parts: -> (y [B, C, P], s after
    the chunk's last row)."""
    y_own, eg, cm, b, xdt_tail, elast = intra
    y = eg * torch.bmm(cm, s0.transpose(1, 2)) + y_own
    return y, elast * s0 + torch.bmm(xdt_tail.transpose(1, 2), b)


def ssd_chunk(
    s0: torch.Tensor, xdt: torch.Tensor, b: torch.Tensor, cm: torch.Tensor, loga: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the Mamba-2 scan for B (sequence, head) pairs: s0 [B, P, N], the rest as
    `ssd_intra`. -> (y [B, C, P], s after the chunk's last row [B, P, N])."""
    return ssd_pass(s0, ssd_intra(xdt, b, cm, loga))


def _chunks(x: torch.Tensor, c: int) -> torch.Tensor:
    """x [H, T, ...] -> [H, nc, c, ...], zero rows after T (nc = ceil(T / c))."""
    h, t = x.shape[:2]
    nc = -(-t // c)
    out = x.new_zeros(h, nc * c, *x.shape[2:])
    out[:, :t] = x
    return out.view(h, nc, c, *x.shape[2:])


def _unchunk(y: torch.Tensor, t: int) -> torch.Tensor:
    """y [H, nc, c, X] -> its first t rows as [T, H, X] (`_chunks`' inverse)."""
    h, nc, c = y.shape[:3]
    return y.view(h, nc * c, -1)[:, :t].transpose(0, 1)


def _in_chunks(intra: Callable[..., tuple], step: Callable[..., tuple], rows: tuple,
               s0: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """rows [H, nc, C, ...] each: every chunk's state-free parts in one batch (`intra`), then
    the chunks in order from s0 (`step(state, j, chunk j's parts) -> (out [H, C, width],
    state)`). -> (out [H, nc, C, width], the state after the last chunk)."""
    h, nc = rows[0].shape[:2]
    flat = (x.reshape(h * nc, *x.shape[2:]) for x in rows)
    parts = [x.view(h, nc, *x.shape[1:]) for x in intra(*flat)]
    out, st = torch.empty(h, nc, rows[0].shape[2], width), s0
    for j in range(nc):
        out[:, j], st = step(st, j, tuple(x[:, j] for x in parts))
    return out, st


def gdn_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    m0: torch.Tensor,
    c: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole prompt in chunks of c (the state-free parts of all chunks in one batch, then
    the chunks in order): q, k, v [T, H, S], g, beta [T, H], m0 [H, S, S] (ours: M [S_v, S_k]
    per head). -> (o [T, H, S], M after row T-1 [H, S, S])."""
    t, h = q.shape[:2]
    qc, kc, vc = (_chunks(x.transpose(0, 1), c) for x in (q, k, v))  # [H, nc, C, S]
    lg, bc = _chunks(torch.log(g).t(), c), _chunks(beta.t(), c)  # [H, nc, C]
    o, m = _in_chunks(gdn_intra, lambda m, j, parts: gdn_pass(m, qc[:, j], kc[:, j], parts, scale),
                      (qc, kc, vc, lg, bc), m0, q.shape[-1])  # fmt: skip
    return _unchunk(o, t), m


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    loga: torch.Tensor,
    bm: torch.Tensor,
    cm: torch.Tensor,
    s0: torch.Tensor,
    c: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole prompt in chunks of c (the state-free parts of all chunks at once, then the
    chunks in order): x [T, H, P], dt, loga [T, H] (dt A), bm, cm [T, G, N], s0 [H, P, N]
    -> (y [T, H, P], s after row T-1 [H, P, N]). Head h reads group h // (H / G); with one
    group (granitehybrid) C B^T and the state's products are one matrix product for all
    heads (`_ssd_g1`)."""
    t, h, p = x.shape
    xdt = _chunks((x * dt.unsqueeze(-1)).transpose(0, 1), c)  # [H, nc, C, P]
    la = _chunks(loga.t(), c)  # [H, nc, C]
    if bm.shape[1] == 1:
        y, s = _ssd_g1(xdt, la, bm[:, 0], cm[:, 0], s0)
        return _unchunk(y, t), s
    grp = torch.arange(h) // (h // bm.shape[1])
    bh, ch = (_chunks(z[:, grp].transpose(0, 1), c) for z in (bm, cm))  # [H, nc, C, N]
    y, s = _in_chunks(ssd_intra, lambda s, j, parts: ssd_pass(s, parts), (xdt, bh, ch, la), s0, p)
    return _unchunk(y, t), s


def _ssd_g1(
    xdt: torch.Tensor, la: torch.Tensor, bm: torch.Tensor, cm: torch.Tensor, s0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ssd_chunked` for one group, on its chunked rows xdt [H, nc, C, P] and la [H, nc, C];
    bm, cm [T, N] shared by every head. -> (y [H, nc, C, P], s after the last row)."""
    h, nc, c, p = xdt.shape
    n = bm.shape[-1]
    bc, cc = (_chunks(z.unsqueeze(0), c)[0] for z in (bm, cm))  # [nc, C, N]
    gcum, eg, tail, elast = _cum_decays(la)  # [H, nc, C], [.., C, 1], [.., C, 1], [.., 1, 1]
    lmat = _decay(gcum.view(h * nc, c)).view(h, nc, c, c) * torch.bmm(cc, bc.transpose(1, 2))
    y = torch.matmul(lmat, xdt)  # [H, nc, C, P]: each chunk's own rows
    xt = xdt * tail  # [H, nc, C, P]
    s = s0.reshape(h * p, n)
    for j in range(nc):  # the state's products: [C, N] x [N, H P] and [H P, C] x [C, N]
        y[:, j] += eg[:, j] * (cc[j] @ s.t()).view(c, h, p).transpose(0, 1)
        s = elast[:, j].view(h, 1, 1).expand(h, p, 1).reshape(h * p, 1) * s + (
            xt[:, j].permute(0, 2, 1).reshape(h * p, c) @ bc[j]
        )
    return y, s.view(h, p, n)
