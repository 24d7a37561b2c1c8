"""Batched LoRA application: one pass per projection for a flat batch of mixed adapter mixes.

For a target, each active adapter ``a`` adds ``sᵢₐ · αₐ/rₐ · Bₐ (Aₐ xᵢ)`` to the rows ``i``
whose mix holds it, adapters in ascending id order. Both products run on `kernels.floatmm`,
whose every output row is a fixed-order function of its input row, and each adapter's
products are reduced over its own rank only: so a row's delta is bitwise the same whatever
other rows, mixes and adapters share the step (concatenating the active adapters' ranks
into one product, as this module once did, made a row's sum depend on which other adapters
were active).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

import torch

from loraserve.kernels.floatmm import lora_delta
from loraserve.kernels.lora16 import Halves, available, lora_delta16
from loraserve.lora.adapter import Adapter
from loraserve.model.context import get_context

OUTPUT = "output.weight"  # the projection that runs on the logits rows only
Span = tuple[int, int, dict[int, float]]  # (row_start, row_end, mix: adapter id -> scale)


class LoraBatch:
    """The `LoraDelta` of one step: rows of ``spans`` get their mix, other rows nothing.

    Built by the registry on the engine thread; ``spans`` are sorted, non-overlapping
    (row_start, row_end, mix) with non-empty mixes of registered adapter ids.
    """

    def __init__(
        self,
        spans: Sequence[Span],
        adapters: Mapping[int, Adapter],
        resident: Set[tuple[int, str]] | None = None,
    ) -> None:
        self._adapters = adapters
        self._resident = resident  # (id, content id) of the resident adapters, if known
        active = sorted({i for _, _, mix in spans for i in mix})
        if missing := [i for i in active if i not in adapters]:
            raise KeyError(f"LoRA adapter id(s) {missing} are not loaded")
        self._top = top = max(end for _, end, _ in spans)
        # each adapter's scale on every flat-batch row (0 where the row's mix lacks it);
        # column ``top`` stays 0 for rows beyond the spans
        table = torch.zeros(len(active), top + 1)  # [n_active, top + 1]
        for start, end, mix in spans:
            for i, sc in mix.items():
                table[active.index(i), start:end] = float(sc)
        keep = [j for j in range(len(active)) if table[j].any()]  # scale 0 everywhere: none
        self.active = tuple(active[j] for j in keep)
        self._table = table[keep]
        self._targets: dict[str, tuple[list, torch.Tensor, torch.Tensor, tuple] | None] = {}
        self._halves: dict[str, list[Halves]] = {}  # targets whose adapters all have halves
        self._full: dict[tuple, torch.Tensor] = {}

    def _target(
        self, target: str, expert: int | None = None
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor, tuple] | None:
        """(A, B) per active adapter targeting ``target`` (ascending ids), their rows in the
        scale table, their factors [n, 1] and a key of both; None if none targets it."""
        key = target if expert is None else f"{target}#{expert}"
        if key not in self._targets:
            sel, pairs, factors, halves = [], [], [], []
            for j, i in enumerate(self.active):
                w = self._adapters[i].weights.get(target)
                if w is None:
                    continue
                a, b = (w.a, w.b) if expert is None else (w.a[expert], w.b[expert])
                sel.append(j)
                pairs.append((a.contiguous(), b.contiguous()))
                factors.append(w.factor)
                if expert is None and w.a16 is not None and w.bt16 is not None:
                    halves.append((w.a16, pairs[-1][1], w.bt16))
            self._targets[key] = None
            if sel and len(halves) == len(sel) and available():
                self._halves[key] = halves
            if sel:
                f = torch.tensor(factors, dtype=torch.float32).unsqueeze(1)  # [n, 1]
                self._targets[key] = (pairs, torch.tensor(sel), f, (*sel, *factors))
        return self._targets[key]

    def targets(self, target: str) -> bool:
        """Whether an adapter active in this step adapts base tensor ``target`` (a MoE layer
        whose experts no adapter targets keeps its one-call path)."""
        return any(target in self._adapters[i].weights for i in self.active)

    def apply(self, target: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` plus the delta of each row's mix, in place; x: [T, in], y: [T, out].

        The output projection sees only the step's logits rows (``ctx.logits_rows``).
        """
        if target == OUTPUT:
            return self._on_rows(target, None, x, y, get_context().logits_rows)
        ent = self._target(target)
        if ent is None:
            return y
        pairs, sel, factors, sig = ent
        t = x.shape[0]
        key = (t, sig)
        scales = self._full.get(key)
        if scales is None:  # the same for most targets of a step: computed once
            cols = torch.arange(t).clamp(max=self._top)
            scales = self._full[key] = self._table[sel][:, cols] * factors  # [n, T]
        return self._delta(target, x, y, pairs, scales)

    def _delta(self, key: str, x: torch.Tensor, y: torch.Tensor, pairs: list,
               scales: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The kernel call: float16 halves where every adapter of the target has them (the
        same bits, half the reads: `kernels.lora16`), else the float32 pairs."""
        halves = self._halves.get(key)
        if halves is not None:
            return lora_delta16(x, y, halves, scales)
        return lora_delta(x, y, pairs, scales)

    def fused_inputs(self, fused: Any, t: int) -> tuple[list[Any], torch.Tensor]:
        """The step's adapters for `kernels.layers.FusedLayers` (``fused``): each active
        adapter's targets (ascending id, as `apply` orders them) and the scale table
        [n_active, t] (0 where a row's mix lacks the adapter), for a step of t rows."""
        keys = self._resident
        if keys is None:
            keys = {(i, a.content_id) for i, a in self._adapters.items() if a.weights}
        if len(keys) + 8 < fused.cached_adapters:  # evicted adapters' arrays go (with
            fused.retain(set(keys))  # their weights: they held them in memory)
        arrays = [
            fused.adapter_targets((i, self._adapters[i].content_id), self._adapters[i].weights)
            for i in self.active
        ]
        cols = torch.arange(t).clamp(max=self._top)
        return arrays, self._table[:, cols].contiguous()  # [n_active, t]

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
        ent = self._target(target, expert)
        if ent is None:
            return y
        pairs, sel, factors, _ = ent
        cols = token_rows.clamp(max=self._top)
        key = target if expert is None else f"{target}#{expert}"
        return self._delta(key, x, y, pairs, self._table[sel][:, cols] * factors)  # [n, m]
