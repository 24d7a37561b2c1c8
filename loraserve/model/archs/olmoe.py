"""olmoe (llama.cpp src/models/olmoe.cpp): q and k each RMS-normed over all their heads at
once, rope on halves, softmax-routed experts whose weights are not renormalised."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return {"qk_norm_mode": "full", "expert_norm": False}


ARCH = Arch(name="olmoe", hf_types=("olmoe",), qk_norm=True, experts="required", gguf=_gguf)
