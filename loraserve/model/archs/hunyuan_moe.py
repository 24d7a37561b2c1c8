"""hunyuan-moe (llama.cpp src/models/hunyuan-moe.cpp): grouped-query attention with rope on
halves and per-head RMSNorm of q and k after rope; softmax-routed experts (renormalised) plus a
shared expert on every layer."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return {"qk_norm_mode": "head_after_rope"}


ARCH = Arch(name="hunyuan-moe", hf_types=("hunyuan_v1_moe",), qk_norm=True, experts="required",
            gguf=_gguf)  # fmt: skip
