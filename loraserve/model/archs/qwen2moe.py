"""qwen2moe (llama.cpp src/models/qwen2moe.cpp): qwen2's attention (q/k/v biases, rope on
halves) with softmax-routed experts whose weights are not renormalised, plus a shared expert
gated by ``sigmoid(x . ffn_gate_inp_shexp)``."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return {"expert_norm": False}


ARCH = Arch(name="qwen2moe", hf_types=("qwen2_moe",), qkv_bias=True, experts="required",
            gguf=_gguf)  # fmt: skip
