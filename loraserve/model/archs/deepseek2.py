"""deepseek2 (llama.cpp src/models/deepseek2.cpp, its MLA path): multi-head latent attention
(`attn.mla`: queries through a low-rank ``attn_q_a`` / ``attn_q_b`` pair or one ``attn_q``, keys
and values from one compressed row per token in the cache, rope on a 64-dim part, on adjacent
pairs), the first ``leading_dense_block_count`` layers dense, then routed experts (softmax or
sigmoid gating, an optional selection bias, optional renormalisation and scale) plus shared
experts.

The file's ``attention.key_length`` / ``value_length`` are the cache row and the latent (576 /
512); ``key_length_mla`` / ``value_length_mla`` a head's query and value dims (192 / 128).
YaRN rope scaling (DeepSeek-V2's long context) is not implemented: such files are refused.
"""

import math
from typing import Any

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError

_GATING = {0: "softmax", 1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    if str(keys.get("rope.scaling.type", "none")) == "yarn" and (
        float(keys.get("rope.scaling.factor", 0.0) or 0.0) > 1.0
    ):
        raise UnsupportedModelError("deepseek2: YaRN rope scaling is not supported yet")
    rank = int(keys.req("attention.kv_lora_rank"))
    rope = int(keys.req("rope.dimension_count"))
    qk = int(keys.req("attention.key_length_mla"))
    gating = int(keys.get("expert_gating_func", 0))
    if gating not in _GATING:
        raise UnsupportedModelError(f"deepseek2: expert gating function {gating}")
    lead = int(keys.get("leading_dense_block_count", 0))
    return dict(
        kv_lora_rank=rank,
        rope_dim=rope,
        qk_nope_dim=qk - rope,
        v_head_dim=int(keys.req("attention.value_length_mla")),
        head_dim=rank + rope,
        n_kv_heads=1,
        attn_scale=1.0 / math.sqrt(qk),
        moe_layers=tuple(i >= lead for i in range(n_layers)),
        expert_gating=_GATING[gating],
        expert_norm=bool(keys.get("expert_weights_norm", False)),
        expert_scale=float(keys.get("expert_weights_scale", 0.0) or 0.0),
    )


# rope="neox": the latent attention reorders its own rope rows (llama.cpp rotates adjacent
# pairs); the generic q/k unpermutation of "norm" architectures must not touch attn_q
ARCH = Arch(name="deepseek2", rope="neox", experts="required", partial_rope=True, gguf=_gguf)
