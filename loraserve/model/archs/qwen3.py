"""qwen3 (llama.cpp src/models/qwen3.cpp): grouped-query attention with per-head RMSNorm of q
and k before rope on halves, SiLU-gated FFN."""

from loraserve.model.archs.base import Arch

ARCH = Arch(name="qwen3", hf_types=("qwen3",), qk_norm=True)
