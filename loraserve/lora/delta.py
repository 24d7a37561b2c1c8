"""Batched LoRA application: one pass per projection for a flat batch of mixed adapter mixes.

For a target, each active adapter ``a`` adds ``sᵢₐ · αₐ/rₐ · Bₐ (Aₐ xᵢ)`` to the rows ``i``
whose mix holds it, adapters in ascending id order. Both products run on `kernels.fmatmul`,
whose every output row is a fixed-order function of its input row, and each adapter's
products are reduced over its own rank only: so a row's delta is bitwise the same whatever
other rows, mixes and adapters share the step (concatenating the active adapters' ranks
into one product, as this module once did, made a row's sum depend on which other adapters
were active).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from loraserve.kernels import fmatmul
from loraserve.lora.adapter import Adapter
from loraserve.model.context import get_context

OUTPUT = "output.weight"  # the projection that runs on the logits rows only
Span = tuple[int, int, dict[int, float]]  # (row_start, row_end, mix: adapter id -> scale)


class LoraBatch:
    """The `LoraDelta` of one step: rows of ``spans`` get their mix, other rows nothing.

    Built by the registry on the engine thread; ``spans`` are sorted, non-overlapping
    (row_start, row_end, mix) with non-empty mixes of registered adapter ids.
    """

    def __init__(self, spans: Sequence[Span], adapters: Mapping[int, Adapter]) -> None:
        self._adapters = adapters
        self.active = tuple(sorted({i for _, _, mix in spans for i in mix}))
        if missing := [i for i in self.active if i not in adapters]:
            raise KeyError(f"LoRA adapter id(s) {missing} are not loaded")
        top = max(end for _, end, _ in spans)
        # per adapter: its scale on every flat-batch row (0 where the row's mix lacks it)
        self._row_scale = {i: torch.zeros(top + 1) for i in self.active}  # [top + 1] each
        for start, end, mix in spans:
            for i, s in mix.items():
                self._row_scale[i][start:end] = float(s)
        # rows of each adapter within the step's rows, and their scales (index form and,
        # when they are one run, slice form)
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor, slice | None]] = {}
        for i in self.active:
            rows = torch.nonzero(self._row_scale[i][:top]).squeeze(1)  # [n_i]
            if rows.numel() == 0:  # scale 0 on every row: the adapter adds nothing
                continue
            lo, hi = int(rows[0]), int(rows[-1]) + 1
            run = slice(lo, hi) if hi - lo == rows.numel() else None
            self._rows[i] = (rows, self._row_scale[i][rows], run)
        self.active = tuple(i for i in self.active if i in self._rows)

    def apply(self, target: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` plus the delta of each row's mix, in place; x: [T, in], y: [T, out].

        The output projection sees only the step's logits rows (``ctx.logits_rows``).
        """
        if target == OUTPUT:
            return self._on_rows(target, None, x, y, get_context().logits_rows)
        for i in self.active:
            w = self._adapters[i].weights.get(target)
            if w is None:
                continue
            rows, scale, run = self._rows[i]
            s = (scale * w.factor).unsqueeze(1)  # [n_i, 1]
            if run is not None:
                h = fmatmul(x[run], w.a).mul_(s)  # [n_i, r]
                y[run] += fmatmul(h, w.b)
            else:
                h = fmatmul(x.index_select(0, rows), w.a).mul_(s)
                y.index_add_(0, rows, fmatmul(h, w.b))
        return y

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
        return self._on_rows(target, expert, x, y, token_rows)

    def _on_rows(
        self,
        target: str,
        expert: int | None,
        x: torch.Tensor,
        y: torch.Tensor,
        token_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Delta for rows x [m, in] / y [m, out] that are flat-batch rows token_rows [m]."""
        for i in self.active:
            w = self._adapters[i].weights.get(target)
            if w is None:
                continue
            table = self._row_scale[i]
            scale = table[token_rows.clamp(max=table.numel() - 1)]  # [m]; beyond: 0
            keep = torch.nonzero(scale).squeeze(1)  # [k]
            if keep.numel() == 0:
                continue
            a, b = (w.a, w.b) if expert is None else (w.a[expert], w.b[expert])
            h = fmatmul(x.index_select(0, keep), a).mul_((scale[keep] * w.factor).unsqueeze(1))
            y.index_add_(0, keep, fmatmul(h, b))
        return y
