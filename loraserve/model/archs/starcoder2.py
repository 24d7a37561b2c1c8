"""starcoder2 (llama.cpp src/models/starcoder2.cpp): LayerNorm with biases (epsilon
``attention.layer_norm_epsilon``) before attention, FFN and output; q/k/v/o with biases, rope on
halves; a plain (ungated) GELU feed-forward ``ffn_up`` -> GELU -> ``ffn_down``, with biases."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return {
        "ffn_kind": "plain",
        "norm": "layer",
        "rms_eps": float(keys.get("attention.layer_norm_epsilon", 1e-5)),
    }


ARCH = Arch(name="starcoder2", hf_types=("starcoder2",), act="gelu_tanh", gguf=_gguf)
