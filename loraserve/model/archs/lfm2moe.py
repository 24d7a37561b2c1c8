"""lfm2moe (llama.cpp src/models/lfm2moe.cpp): lfm2's layers (short convolutions and attention),
the first ``leading_dense_block_count`` FFNs dense, then routed experts (``expert_gating_func``,
selection bias ``exp_probs_b``, the chosen weights renormalised and scaled by
``expert_weights_scale``)."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys
from loraserve.model.archs.lfm2 import shortconv
from loraserve.model.archs.minimax_m2 import gating


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    lead = int(keys.get("leading_dense_block_count", 0))
    return shortconv(keys, n_layers) | {
        "moe_layers": tuple(i >= lead for i in range(n_layers)),
        "expert_gating": gating(keys, 1),
        "expert_norm": True,
        "expert_scale": float(keys.get("expert_weights_scale", 0.0) or 0.0),
    }


ARCH = Arch(name="lfm2moe", qk_norm=True, experts="required", recurrent=True, gguf=_gguf)
