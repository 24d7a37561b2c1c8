"""glm4moe (llama.cpp src/models/glm4-moe.cpp): attention with q/k/v biases and per-head q/k
RMSNorm where the file has them, rope on halves; its pre-FFN norm stored as
``post_attention_norm``; the first ``leading_dense_block_count`` layers dense, then routed
experts (``expert_gating_func``, sigmoid by default, selection bias ``exp_probs_b``, weights
renormalised and scaled as ``expert_weights_norm`` / ``expert_weights_scale`` say) plus shared
experts. The multi-token-prediction layers (``nextn_predict_layers``) at the end are not run."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys
from loraserve.model.archs.minimax_m2 import gating


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    n = n_layers - int(keys.get("nextn_predict_layers", 0))
    lead = int(keys.get("leading_dense_block_count", 0))
    return {
        "n_layers": n,
        "moe_layers": tuple(i >= lead for i in range(n)),
        "expert_gating": gating(keys, 2),
        "expert_norm": bool(keys.get("expert_weights_norm", False)),
        "expert_scale": float(keys.get("expert_weights_scale", 0.0)),
        "ffn_norm_name": "post_attention_norm",
        "qk_norm_mode": "head_if_present",
    }


ARCH = Arch(name="glm4moe", hf_types=("glm4_moe",), experts="required", gguf=_gguf)
