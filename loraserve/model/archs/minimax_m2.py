"""minimax-m2 (llama.cpp src/models/minimax-m2.cpp): q and k each RMS-normed over all their
heads at once, rope on halves; routed experts gated as ``expert_gating_func`` says (sigmoid in
the released models) with a selection bias ``exp_probs_b``, weights renormalised."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError

GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}  # llama_expert_gating_func_type


def gating(keys: Keys, default: int) -> str:
    """The routers' gating function from ``expert_gating_func``."""
    g = int(keys.get("expert_gating_func", default) or default)
    if g not in GATING:
        raise UnsupportedModelError(f"{keys.arch}: expert gating function {g} is not supported")
    return GATING[g]


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return {"qk_norm_mode": "full", "expert_gating": gating(keys, 2)}


ARCH = Arch(name="minimax-m2", hf_types=("minimax_m2",), qk_norm=True, experts="required",
            gguf=_gguf)  # fmt: skip
