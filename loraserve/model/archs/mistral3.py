"""mistral3 (llama.cpp src/models/mistral3.cpp): llama's layers (rope on adjacent pairs, dense
or softmax-routed experts), with the softmax scale from ``attention.scale`` when set."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    scale = float(keys.get("attention.scale", 0.0))
    return {"attn_scale": scale} if scale else {}


ARCH = Arch(name="mistral3", rope="norm", experts="optional", gguf=_gguf)
