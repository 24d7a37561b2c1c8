"""seed_oss (llama.cpp src/models/seed-oss.cpp): grouped-query attention (biases where the
file has them) with rope on halves and a SiLU-gated FFN, its pre-FFN norm stored as
``post_attention_norm``; the softmax scale from ``attention.scale`` when set."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    scale = float(keys.get("attention.scale", 0.0))
    return {"ffn_norm_name": "post_attention_norm"} | ({"attn_scale": scale} if scale else {})


ARCH = Arch(name="seed_oss", gguf=_gguf)
