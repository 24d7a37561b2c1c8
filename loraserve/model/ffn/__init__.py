"""Feed-forward kinds: the gated dense FFN (in `decoder.Block`) and routed experts (`moe`); an
architecture picks its kind per layer in its `archs/` file."""

from loraserve.model.ffn.moe import MoE

__all__ = ["MoE"]
