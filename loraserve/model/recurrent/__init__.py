"""Recurrent layer kinds: mixers that carry a per-sequence state from token to token instead
of keys that later tokens attend (short convolution, Mamba-1, Mamba-2).

Layer kinds (`ModelConfig.layer_kinds`): "attn"; "shortconv", "mamba1", "mamba2" (the mixer in
place of attention); "attn+mamba2" (attention and a Mamba-2 mixer side by side on the same
normed input, their outputs summed: falcon-h1); "ffn" (no mixer, the layer's FFN alone on its
attention norm: nemotron-h). `tensors` lists and checks each kind's tensors.

Each kind reads its sequences' states from the step context (``ctx.states``: one
`cache.state.SeqStep` per sequence, rows in batch order) and writes the states after them;
it never changes a state tensor in place (snapshots share them). `build` makes the kind a
`ModelConfig.layer_kinds` entry names; `state_shapes` gives each recurrent layer's state shape.
"""

from __future__ import annotations

from torch import nn

from loraserve.model.config import ModelConfig
from loraserve.model.recurrent.deltanet import GatedDeltaNet
from loraserve.model.recurrent.mamba1 import Mamba1
from loraserve.model.recurrent.mamba2 import Mamba2
from loraserve.model.recurrent.shortconv import ShortConv
from loraserve.model.weights import WeightSource

__all__ = [
    "GatedDeltaNet",
    "Mamba1",
    "Mamba2",
    "ShortConv",
    "build",
    "kv_heads",
    "state_shapes",
]


def build(cfg: ModelConfig, i: int, w: WeightSource) -> nn.Module | None:
    """Layer ``i``'s recurrent mixer, or None where it has none (attention, FFN alone)."""
    kind = cfg.layer_kinds[i]
    if kind in ("attn", "ffn"):
        return None
    if kind == "shortconv":
        return ShortConv(cfg, i, w)
    if kind == "deltanet":
        return GatedDeltaNet(cfg, i, w)
    if kind in ("mamba2", "attn+mamba2"):
        return Mamba2(cfg, i, w)
    if kind == "mamba1":
        return Mamba1(cfg, i, w)
    raise ValueError(f"unknown layer kind {kind!r}")


def kv_heads(cfg: ModelConfig, i: int) -> int:
    """Layer ``i``'s KV heads in the cache: the model's where the layer attends ("attn",
    "attn+..."), none where it has no attention (a recurrent mixer alone, an FFN alone)."""
    kind = cfg.layer_kinds[i]
    return cfg.n_kv_heads if kind == "attn" or kind.startswith("attn+") else 0


def state_shapes(cfg: ModelConfig) -> dict[int, tuple[int, ...]]:
    """Recurrent layer index -> the shape of one sequence's state there."""
    out = {}
    for i, kind in enumerate(cfg.layer_kinds):
        if kind == "shortconv":
            out[i] = ShortConv.state_shape(cfg)
        elif kind == "deltanet":
            out[i] = GatedDeltaNet.state_shape(cfg)
        elif kind in ("mamba2", "attn+mamba2"):
            out[i] = Mamba2.state_shape(cfg)
        elif kind == "mamba1":
            out[i] = Mamba1.state_shape(cfg)
    return out
