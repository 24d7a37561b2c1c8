"""qwen3moe (llama.cpp src/models/qwen3moe.cpp): qwen3's attention (per-head q/k RMSNorm, rope
on halves) with softmax-routed experts on every layer, the chosen weights renormalised."""

from loraserve.model.archs.base import Arch

ARCH = Arch(name="qwen3moe", hf_types=("qwen3_moe",), qk_norm=True, experts="required")
