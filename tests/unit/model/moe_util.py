"""Stand-ins for what `RoutedExperts` reads in the grouped-expert tests: stacked expert tensors
(the `WeightSource` surface) and per-expert LoRA deltas applied by the engine's LoRA kernel."""

from __future__ import annotations

import torch

from loraserve.kernels.floatmm import lora_delta
from loraserve.model.projection import Matrix


class ExpertWeights:
    """The WeightSource surface RoutedExperts reads: stacked expert tensors as Matrix lists."""

    def __init__(self, tensors: dict[str, list[Matrix]], floats: dict[str, torch.Tensor]):
        self.tensors, self.floats = tensors, floats

    def has(self, name: str) -> bool:
        return name in self.tensors or name in self.floats

    def experts(self, name: str) -> list[Matrix] | None:
        return self.tensors.get(name)

    def float(self, name: str) -> torch.Tensor | None:
        return self.floats.get(name)

    def release(self, name: str) -> None:
        pass


class ExpertLora:
    """Per expert, a rank-4 delta on every stacked target, each token at its own scale (0:
    the token has no adapter), applied by the engine's LoRA kernel (`lora_delta`)."""

    def __init__(self, scales: torch.Tensor, seed: int) -> None:
        self.scales, self.seed, self.ab = scales, seed, {}
        self.calls = 0

    def apply_expert(self, target, e, x, y, tok):  # type: ignore[no-untyped-def]
        key = (target, e)
        if key not in self.ab:
            g = torch.Generator().manual_seed(self.seed + len(self.ab))
            self.ab[key] = (torch.randn(4, x.shape[1], generator=g) * 0.05,
                            torch.randn(y.shape[1], 4, generator=g) * 0.05)  # fmt: skip
        self.calls += 1
        return lora_delta(x, y, [self.ab[key]], self.scales[tok].unsqueeze(0))
