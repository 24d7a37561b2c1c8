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
from loraserve.kernels.lora16 import available, lora_delta16
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
        self._full: dict[tuple, torch.Tensor] = {}

    def _target(
        self, target: str, expert: int | None = None
    ) -> tuple[list[tuple[bool, tuple]], torch.Tensor, torch.Tensor, tuple] | None:
        """Per active adapter targeting ``target`` (ascending ids): (True, its `Halves`)
        where the kernels read its float16 halves, else (False, (A, B) float32); their rows
        in the scale table, their factors [n, 1] and a key of both; None if none targets
        it."""
        key = target if expert is None else f"{target}#{expert}"
        if key not in self._targets:
            sel, items, factors = [], [], []
            half_route = available()
            for j, i in enumerate(self.active):
                w = self._adapters[i].weights.get(target)
                if w is None:
                    continue
                sel.append(j)
                factors.append(w.factor)
                if expert is None and half_route and w.a16 is not None:
                    items.append((True, (w.a16, w.bt16, w.tail16)))
                    continue
                a, b = (w.a, w.b) if expert is None else (w.a[expert], w.b[expert])
                items.append((False, (a.contiguous(), b.contiguous())))
            self._targets[key] = None
            if sel:
                f = torch.tensor(factors, dtype=torch.float32).unsqueeze(1)  # [n, 1]
                self._targets[key] = (items, torch.tensor(sel), f, (*sel, *factors))
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
        items, sel, factors, sig = ent
        t = x.shape[0]
        key = (t, sig)
        scales = self._full.get(key)
        if scales is None:  # the same for most targets of a step: computed once
            cols = torch.arange(t).clamp(max=self._top)
            scales = self._full[key] = self._table[sel][:, cols] * factors  # [n, T]
        return self._delta(x, y, items, scales)

    @staticmethod
    def _delta(x: torch.Tensor, y: torch.Tensor, items: list[tuple[bool, tuple]],
               scales: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The kernel calls, one per run of adapters of one kind in order: float16 halves
        (the same bits as their float32 values, half the reads, no float32 copy held:
        `kernels.lora16`), else the float32 pairs. Each output adds the adapters' deltas in
        their order, as one call over all of them would."""
        i = 0
        while i < len(items):
            e = i
            while e < len(items) and items[e][0] == items[i][0]:
                e += 1
            run = [payload for _, payload in items[i:e]]
            if items[i][0]:
                lora_delta16(x, y, run, scales[i:e])
            else:
                lora_delta(x, y, run, scales[i:e])
            i = e
        return y

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
        items, sel, factors, _ = ent
        cols = token_rows.clamp(max=self._top)
        return self._delta(x, y, items, self._table[sel][:, cols] * factors)  # [n, m]
