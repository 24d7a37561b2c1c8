"""phi3 (llama.cpp src/models/phi3.cpp): llama's layers with q|k|v stored as one ``attn_qkv``
tensor and gate|up as one ``ffn_up`` tensor (twice the FFN width, gate first), rope on halves
with per-frequency factors (``rope_factors_short``; the long ones are for contexts past the
trained one, which loraserve does not switch to yet). llama.cpp ignores phi3's sliding window;
so does this."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return {"ffn_kind": "fused"}


ARCH = Arch(name="phi3", hf_types=(), gguf=_gguf)
