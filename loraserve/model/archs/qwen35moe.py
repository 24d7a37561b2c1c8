"""qwen35moe (Qwen3.5 MoE; llama.cpp src/models/qwen35moe.cpp): qwen35's layers (gated
delta-net and gated attention) with softmax-routed experts on every layer, the chosen weights
renormalised and scaled by ``expert_weights_scale``, plus a shared expert gated by
``sigmoid(x . ffn_gate_inp_shexp)``."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError
from loraserve.model.archs.qwen35 import deltanet


def moe(keys: Keys, n_layers: int) -> dict[str, Any]:
    """qwen35's layers with routed experts everywhere (qwen35moe, qwen3next)."""
    return deltanet(keys, n_layers) | {
        "expert_norm": True,
        "expert_scale": float(keys.get("expert_weights_scale", 0.0) or 0.0),
        "expert_ffn_dim": expert_width(keys),
    }


def expert_width(keys: Keys) -> int:
    """The routed experts' width as llama.cpp's qwen35moe / qwen3next read it:
    ``expert_feed_forward_length``, else ``feed_forward_length / expert_used_count`` (no layer
    has a dense FFN, so a file may have either key alone)."""
    width = int(keys.get("expert_feed_forward_length", 0) or 0)
    if width:
        return width
    n_ff, used = keys.get("feed_forward_length"), int(keys.get("expert_used_count", 0) or 0)
    if n_ff is None or used < 1 or int(n_ff) % used:
        raise UnsupportedModelError(
            f"GGUF metadata lacks {keys.arch}.expert_feed_forward_length, and "
            f"{keys.arch}.feed_forward_length ({n_ff}) over expert_used_count ({used}) does "
            "not give the experts' width"
        )
    return int(n_ff) // used


ARCH = Arch(name="qwen35moe", qk_norm=True, experts="required", recurrent=True,
            ffn_optional=True, gguf=moe)  # fmt: skip
