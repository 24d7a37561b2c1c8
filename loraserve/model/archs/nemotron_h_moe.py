"""nemotron_h_moe (llama.cpp src/models/nemotron-h-moe.cpp's loader, nemotron-h.cpp's graph):
nemotron_h's layers. Its routed experts (sigmoid routing with a selection bias, relu^2 experts
without a gate, an optional latent projection, a shared expert) are not run yet: a file with
experts is refused by name; without them it is nemotron_h."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError
from loraserve.model.archs.nemotron_h import layers


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    if int(keys.get("expert_count", 0) or 0) > 0:
        raise UnsupportedModelError(
            "nemotron_h_moe: routed experts (relu^2 without gate, sigmoid routing) are not "
            "supported yet"
        )
    return layers(keys, n_layers)


ARCH = Arch(name="nemotron_h_moe", recurrent=True, gguf=_gguf)
