"""The maths of merging LoRA adapters: one low-rank pair per target from a weighted sum.

Each input contributes a `Term` ``c·B A`` with ``c`` = user weight · the adapter's alpha/r
factor, so the exact merged delta of a target is ``ΔW = Σᵢ cᵢ Bᵢ Aᵢ``. The result is a pair
whose factor is 1 (``ΔW ≈ B A``), in one of three modes:

- ``cat``: the pairs stacked along the rank axis; exact, rank ``R = Σ rᵢ``.
- ``linear``: PEFT's ``add_weighted_adapter(combination_type="linear")``:
  ``A = Σ sign(cᵢ)·√|cᵢ|·Aᵢ``, ``B = Σ √|cᵢ|·Bᵢ`` (equal ranks only). Approximate: the cross
  terms ``Bᵢ Aⱼ`` are not part of ``ΔW``; exact for one input.
- ``ortho-svd``: the best rank-r approximation of ``ΔW`` (Eckart-Young), from the factors:
  ``[c₁B₁ … cₙBₙ] = Q_B R_B``, ``[A₁; …; Aₙ]ᵀ = Q_A R_A``, ``R_B R_Aᵀ = U S Vᵀ`` (a small
  R x R core), ``B = Q_B U_r √S_r``, ``A = √S_r V_rᵀ Q_Aᵀ``. ``rank=None`` picks per target the
  smallest r keeping ``energy`` of ``Σ S²``.

Everything runs in float64 on [out, R] / [R, in] matrices; no [out, in] matrix is formed.
Stacked MoE experts ([E, r, in] / [E, out, r]) are merged per expert with one rank for all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MODES = ("cat", "linear", "ortho-svd")
ZERO_TOL = 1e-6  # ||ΔW|| below this fraction of Σ|cᵢ|·||Bᵢ||·||Aᵢ|| is zero (cancellation)


class MergeError(ValueError):
    """Inputs that cannot be merged as asked; the message says why."""


@dataclass(frozen=True)
class Term:
    """One input's pair for a target, contributing ``coef · b @ a``."""

    a: torch.Tensor  # [r, in] or [E, r, in]
    b: torch.Tensor  # [out, r] or [E, out, r]
    coef: float  # user weight · the adapter's alpha/r factor

    @property
    def rank(self) -> int:
        return self.a.shape[-2]


@dataclass(frozen=True)
class Merged:
    """A merged target: ``ΔW ≈ b @ a`` at factor 1, as stored (in the output dtype)."""

    a: torch.Tensor  # [r, in] or [E, r, in]; r = 0 when the exact delta is zero
    b: torch.Tensor  # [out, r] or [E, out, r]
    rel_error: float  # ||b a - ΔW||_F / ||ΔW||_F, measured on the stored factors
    norm: float  # ||ΔW||_F

    @property
    def rank(self) -> int:
        return self.a.shape[-2]


def max_rank(terms: list[Term]) -> int:
    """The largest rank a merge of ``terms`` can have: min(Σ rᵢ, out, in)."""
    out, inp = terms[0].b.shape[-2], terms[0].a.shape[-1]
    return min(sum(t.rank for t in terms), out, inp)


def merge_target(
    terms: list[Term],
    mode: str,
    rank: int | None = None,
    energy: float = 0.99,
    dtype: torch.dtype = torch.float32,
) -> Merged:
    """Merge one target's terms (all of the same base shape) in ``mode``.

    ``rank`` (ortho-svd only) is capped at `max_rank`; None chooses it by ``energy``.
    ``dtype`` is the stored dtype: the reported error includes its rounding.
    """
    if mode not in MODES:
        raise MergeError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if not terms:
        raise MergeError("nothing to merge: no input has this target")
    b_cat, a_cat = _stacked(terms)
    norm = math.sqrt(max(_frob2(b_cat, a_cat), 0.0))
    bound = sum(abs(t.coef) * _fro(t.b) * _fro(t.a) for t in terms)
    if norm <= ZERO_TOL * bound:
        return Merged(a_cat[..., :0, :].to(dtype), b_cat[..., :0].to(dtype), 0.0, 0.0)
    if mode == "cat":
        b, a = _cat(terms)
    elif mode == "linear":
        b, a = _linear(terms)
    else:
        b, a = _ortho_svd(b_cat, a_cat, rank, energy)
    a, b = a.to(dtype).contiguous(), b.to(dtype).contiguous()
    diff2 = _frob2(torch.cat([b.double(), -b_cat], -1), torch.cat([a.double(), a_cat], -2))
    return Merged(a, b, math.sqrt(max(diff2, 0.0)) / norm, norm)


def _stacked(terms: list[Term]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B [.., out, R] with the coefficients folded in, A [.., R, in]) in float64."""
    b = torch.cat([t.b.double() * t.coef for t in terms], -1)
    a = torch.cat([t.a.double() for t in terms], -2)
    return b, a


def _fro(x: torch.Tensor) -> float:
    return x.double().norm().item()


def _frob2(b: torch.Tensor, a: torch.Tensor) -> float:
    """||b @ a||²_F (summed over experts) from the Gram matrices: tr(bᵀb · a aᵀ)."""
    return ((b.mT @ b) * (a @ a.mT)).sum().item()


def _split(terms: list[Term]) -> list[tuple[float, float]]:
    """PEFT's split of each coefficient: (for B, for A) = (√|c|, sign(c)·√|c|)."""
    return [(math.sqrt(abs(t.coef)), math.copysign(math.sqrt(abs(t.coef)), t.coef)) for t in terms]


def _cat(terms: list[Term]) -> tuple[torch.Tensor, torch.Tensor]:
    split = _split(terms)
    b = torch.cat([t.b.double() * sb for t, (sb, _) in zip(terms, split, strict=True)], -1)
    a = torch.cat([t.a.double() * sa for t, (_, sa) in zip(terms, split, strict=True)], -2)
    return b, a


def _linear(terms: list[Term]) -> tuple[torch.Tensor, torch.Tensor]:
    ranks = sorted({t.rank for t in terms})
    if len(ranks) > 1:
        raise MergeError(f"linear mode needs equal ranks, got {ranks}; use --mode cat or ortho-svd")
    split = _split(terms)
    b = torch.stack([t.b.double() * sb for t, (sb, _) in zip(terms, split, strict=True)]).sum(0)
    a = torch.stack([t.a.double() * sa for t, (_, sa) in zip(terms, split, strict=True)]).sum(0)
    return b, a


def _ortho_svd(
    b_cat: torch.Tensor, a_cat: torch.Tensor, rank: int | None, energy: float
) -> tuple[torch.Tensor, torch.Tensor]:
    qb, rb = torch.linalg.qr(b_cat)  # [.., out, k1], [.., k1, R]
    qa, ra = torch.linalg.qr(a_cat.mT)  # [.., in, k2], [.., k2, R]
    u, s, vh = torch.linalg.svd(rb @ ra.mT, full_matrices=False)  # core [.., k1, k2]
    k = s.shape[-1]
    r = min(rank, k) if rank is not None else energy_rank(s, energy)
    root = s[..., :r].sqrt()  # [.., r]
    b = (qb @ u[..., :r]) * root[..., None, :]  # [.., out, r]
    a = root[..., :, None] * (vh[..., :r, :] @ qa.mT)  # [.., r, in]
    return b, a


def energy_rank(s: torch.Tensor, energy: float) -> int:
    """The smallest r whose top-r singular values keep ``energy`` of Σ s² (over all experts).

    s: [k] or [E, k], descending along the last axis.
    """
    if not 0.0 < energy <= 1.0:
        raise MergeError(f"energy must be in (0, 1], got {energy}")
    per_rank = s.reshape(-1, s.shape[-1]).double().pow(2).sum(0)  # [k]
    cum = per_rank.cumsum(0)
    total = cum[-1].item()
    r = int((cum < energy * total * (1 - 1e-12)).sum().item()) + 1
    return max(1, min(r, s.shape[-1]))
