"""qwen35moe (Qwen3.5 MoE; llama.cpp src/models/qwen35moe.cpp): qwen35's layers (gated
delta-net and gated attention) with softmax-routed experts on every layer, the chosen weights
renormalised and scaled by ``expert_weights_scale``, plus a shared expert gated by
``sigmoid(x . ffn_gate_inp_shexp)``."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys
from loraserve.model.archs.qwen35 import deltanet


def moe(keys: Keys, n_layers: int) -> dict[str, Any]:
    """qwen35's layers with routed experts everywhere (qwen35moe, qwen3next)."""
    return deltanet(keys, n_layers) | {
        "expert_norm": True,
        "expert_scale": float(keys.get("expert_weights_scale", 0.0) or 0.0),
    }


ARCH = Arch(name="qwen35moe", qk_norm=True, experts="required", recurrent=True, gguf=moe)
