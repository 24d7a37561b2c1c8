"""Recurrent layer kinds: mixers that carry a per-sequence state from token to token instead
of keys that later tokens attend (short convolution, Mamba-2, gated delta-net).

Each kind reads its sequences' states from the step context (``ctx.states``: one
`cache.state.SeqStep` per sequence, rows in batch order) and writes the states after them;
it never changes a state tensor in place (snapshots share them). `build` makes the kind a
`ModelConfig.layer_kinds` entry names; `state_shapes` gives each recurrent layer's state shape.
"""

from __future__ import annotations

from torch import nn

from loraserve.model.config import ModelConfig
from loraserve.model.recurrent.deltanet import GatedDeltaNet
from loraserve.model.recurrent.mamba2 import Mamba2
from loraserve.model.recurrent.shortconv import ShortConv
from loraserve.model.weights import WeightSource

__all__ = ["GatedDeltaNet", "Mamba2", "ShortConv", "build", "state_shapes"]


def build(cfg: ModelConfig, i: int, w: WeightSource) -> nn.Module | None:
    """Layer ``i``'s recurrent mixer, or None where it is attention."""
    kind = cfg.layer_kinds[i]
    if kind == "attn":
        return None
    if kind == "shortconv":
        return ShortConv(cfg, i, w)
    if kind == "deltanet":
        return GatedDeltaNet(cfg, i, w)
    if kind == "mamba2":
        return Mamba2(cfg, i, w)
    raise ValueError(f"unknown layer kind {kind!r}")


def state_shapes(cfg: ModelConfig) -> dict[int, tuple[int, ...]]:
    """Recurrent layer index -> the shape of one sequence's state there."""
    out = {}
    for i, kind in enumerate(cfg.layer_kinds):
        if kind == "shortconv":
            out[i] = ShortConv.state_shape(cfg)
        elif kind == "deltanet":
            out[i] = GatedDeltaNet.state_shape(cfg)
        elif kind == "mamba2":
            out[i] = Mamba2.state_shape(cfg)
    return out
