"""Batched LoRA application: one pass per projection for a flat batch of mixed adapter mixes.

For a target, the A's of the step's active adapters are concatenated along the rank axis
(``A_cat`` [R, in], ``R = Σ rₐ``) and so are the B's (``Bᵀ_cat`` [R, out]); both are cached
per (adapter set, target, dtype) across steps. Each LoRA row gets a scale per rank column,
``S[i, cols(a)] = sᵢₐ · αₐ/rₐ`` (0 where the row's mix lacks ``a``), so

    y[rows] += ((x[rows] @ A_catᵀ) * S) @ Bᵀ_cat

is the whole step's delta for every mix at once. Rows without a mix are never gathered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loraserve.lora.adapter import Adapter
from loraserve.model.context import get_context

OUTPUT = "output.weight"  # the projection that runs on the logits rows only
Span = tuple[int, int, dict[int, float]]  # (row_start, row_end, mix: adapter id -> scale)


@dataclass(frozen=True)
class ConcatWeights:
    """The active adapters' pairs for one target, concatenated along the rank axis."""

    ids: tuple[int, ...]  # adapters (of the active set) that target this tensor
    ranks: tuple[int, ...]
    factors: tuple[float, ...]
    a: torch.Tensor  # [R, in] or [E, R, in]
    bt: torch.Tensor  # [R, out] or [E, R, out]: B transposed


class ConcatCache:
    """`ConcatWeights` per target for the most recently used adapter sets (LRU)."""

    def __init__(self, max_sets: int = 8) -> None:
        self.max_sets = max_sets
        self._sets: OrderedDict[tuple[tuple[int, ...], torch.dtype], dict] = OrderedDict()

    def table(self, ids: tuple[int, ...], dtype: torch.dtype) -> dict[str, ConcatWeights | None]:
        """The (lazily filled) target table of one adapter set; marks it recently used."""
        key = (ids, dtype)
        t = self._sets.get(key)
        if t is None:
            t = self._sets[key] = {}
            while len(self._sets) > self.max_sets:
                self._sets.popitem(last=False)
        else:
            self._sets.move_to_end(key)
        return t

    def drop(self, adapter_id: int) -> None:
        """Forget every set holding ``adapter_id`` (called on unload)."""
        for key in [k for k in self._sets if adapter_id in k[0]]:
            del self._sets[key]


def concat_weights(
    target: str, ids: tuple[int, ...], adapters: Mapping[int, Adapter], dtype: torch.dtype
) -> ConcatWeights | None:
    """Concatenate the pairs of ``ids`` that target ``target`` (None if none does)."""
    ws = [(i, adapters[i].weights[target]) for i in ids if target in adapters[i].weights]
    if not ws:
        return None
    a = torch.cat([w.a for _, w in ws], dim=-2).to(dtype)
    bt = torch.cat([w.b.transpose(-1, -2) for _, w in ws], dim=-2).to(dtype).contiguous()
    return ConcatWeights(
        tuple(i for i, _ in ws),
        tuple(w.rank for _, w in ws),
        tuple(w.factor for _, w in ws),
        a.contiguous(),
        bt,
    )


class LoraBatch:
    """The `LoraDelta` of one step: rows of ``spans`` get their mix, other rows nothing.

    Built by the registry on the engine thread; ``spans`` are sorted, non-overlapping
    (row_start, row_end, mix) with non-empty mixes of registered adapter ids.
    """

    def __init__(
        self, spans: Sequence[Span], adapters: Mapping[int, Adapter], cache: ConcatCache
    ) -> None:
        self._adapters, self._cache = adapters, cache
        self.active = tuple(sorted({i for _, _, mix in spans for i in mix}))
        if missing := [i for i in self.active if i not in adapters]:
            raise KeyError(f"LoRA adapter id(s) {missing} are not loaded")
        self.mixes: list[dict[int, float]] = []
        group_of: dict[tuple[tuple[int, float], ...], int] = {}
        rows: list[int] = []
        groups: list[int] = []
        for start, end, mix in spans:
            key = tuple(sorted(mix.items()))
            if key not in group_of:
                group_of[key] = len(self.mixes)
                self.mixes.append(dict(mix))
            rows.extend(range(start, end))
            groups.extend([group_of[key]] * (end - start))
        self.rows = torch.tensor(rows)  # [n] flat-batch rows that carry a mix
        self.row_group = torch.tensor(groups)  # [n] index into self.mixes
        n = self.rows.numel()
        contiguous = all(spans[j][0] == spans[j - 1][1] for j in range(1, len(spans)))
        self._slice = (spans[0][0], spans[0][0] + n) if contiguous else None
        self._group_full: torch.Tensor | None = None  # [max_row + 2] group per row, -1: none
        self._table: dict[str, ConcatWeights | None] | None = None
        self._memo: dict[str, tuple[ConcatWeights, torch.Tensor, torch.Tensor] | None] = {}
        self._scales: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _entry(
        self, target: str, dtype: torch.dtype
    ) -> tuple[ConcatWeights, torch.Tensor, torch.Tensor] | None:
        """(weights, S per group [G, R], S per LoRA row [n or 1, R]) or None."""
        if target in self._memo:
            return self._memo[target]
        if self._table is None:
            self._table = self._cache.table(self.active, dtype)
        if target not in self._table:
            self._table[target] = concat_weights(target, self.active, self._adapters, dtype)
        cw = self._table[target]
        ent = None
        if cw is not None:
            sig = (cw.ids, cw.ranks, cw.factors)
            if sig not in self._scales:
                coef = torch.tensor(
                    [
                        [m.get(i, 0.0) * f for i, f in zip(cw.ids, cw.factors, strict=True)]
                        for m in self.mixes
                    ],
                    dtype=torch.float32,
                )  # [G, K]; float32 even for bf16 activations
                s_group = coef.repeat_interleave(torch.tensor(cw.ranks), dim=1)  # [G, R]
                s_rows = s_group if len(self.mixes) == 1 else s_group[self.row_group]
                self._scales[sig] = (s_group, s_rows)
            ent = (cw, *self._scales[sig])
        self._memo[target] = ent
        return ent

    def apply(self, target: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` plus the delta of each row's mix, in place; x: [T, in], y: [T, out].

        The output projection sees only the step's logits rows (``ctx.logits_rows``).
        """
        ent = self._entry(target, x.dtype)
        if ent is None:
            return y
        cw, s_group, s = ent
        if target == OUTPUT:
            return self._rows(cw.a, cw.bt, s_group, x, y, get_context().logits_rows)
        if self._slice is not None:
            lo, hi = self._slice
            h = F.linear(x[lo:hi], cw.a).mul_(s)  # [n, R]
            y[lo:hi].addmm_(h, cw.bt)
            return y
        h = F.linear(x.index_select(0, self.rows), cw.a).mul_(s)  # [n, R]
        return y.index_add_(0, self.rows, h @ cw.bt)

    def apply_expert(
        self,
        target: str,
        expert: int,
        x: torch.Tensor,
        y: torch.Tensor,
        token_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Stacked-expert target: x [m, in], y [m, out] are the rows routed to ``expert``;
        token_rows [m] their flat-batch rows."""
        ent = self._entry(target, x.dtype)
        if ent is None:
            return y
        cw, s_group, _ = ent
        return self._rows(cw.a[expert], cw.bt[expert], s_group, x, y, token_rows)

    def _rows(
        self,
        a: torch.Tensor,
        bt: torch.Tensor,
        s_group: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        token_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Delta for rows x [m, in] / y [m, out] that are flat-batch rows token_rows [m]."""
        g = self._groups_of(token_rows)  # [m] group or -1
        keep = torch.nonzero(g >= 0).squeeze(1)  # [k]
        if keep.numel() == 0:
            return y
        if keep.numel() == g.numel():
            h = F.linear(x, a).mul_(s_group[g])  # [m, R]
            return y.addmm_(h, bt)
        h = F.linear(x.index_select(0, keep), a).mul_(s_group[g[keep]])  # [k, R]
        return y.index_add_(0, keep, h @ bt)

    def _groups_of(self, token_rows: torch.Tensor) -> torch.Tensor:
        if self._group_full is None:
            top = int(self.rows.max()) + 1
            full = torch.full((top + 1,), -1, dtype=torch.long)  # last entry: rows beyond
            full[self.rows] = self.row_group
            self._group_full = full
        return self._group_full[token_rows.clamp(max=self._group_full.numel() - 1)]
