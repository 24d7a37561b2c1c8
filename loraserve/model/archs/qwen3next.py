"""qwen3next (Qwen3-Next; llama.cpp src/models/qwen3next.cpp): qwen35moe's layers, with the
delta-net's beta and alpha logits in one ``ssm_ba`` (per key head its betas, then its alphas)
and each key head shared by consecutive value heads (`recurrent.GatedDeltaNet`); plain rope on
halves in the attention layers."""

from loraserve.model.archs.base import Arch
from loraserve.model.archs.qwen35moe import moe

ARCH = Arch(name="qwen3next", qk_norm=True, experts="required", recurrent=True,
            ffn_optional=True, gguf=moe)  # fmt: skip
