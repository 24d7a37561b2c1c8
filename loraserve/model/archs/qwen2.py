"""qwen2 (llama.cpp src/models/qwen2.cpp): llama's layers with biases on q, k and v and rope on
halves."""

from loraserve.model.archs.base import Arch

ARCH = Arch(name="qwen2", hf_types=("qwen2",), qkv_bias=True)
