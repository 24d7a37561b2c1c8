"""llama (dense and MoE; llama.cpp src/models/llama.cpp): grouped-query attention with rope on
adjacent pairs, SiLU-gated FFN or softmax-routed experts (renormalised top-k)."""

from loraserve.model.archs.base import Arch

ARCH = Arch(name="llama", hf_types=("llama", "mistral", "mixtral"), rope="norm", experts="optional")
