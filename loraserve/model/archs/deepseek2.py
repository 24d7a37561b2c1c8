"""deepseek2 (llama.cpp src/models/deepseek2.cpp, its MLA path): multi-head latent attention
(`attn.mla`: queries through a low-rank ``attn_q_a`` / ``attn_q_b`` pair or one ``attn_q``, keys
and values from one compressed row per token in the cache, rope on a 64-dim part, on adjacent
pairs), the first ``leading_dense_block_count`` layers dense, then routed experts (softmax or
sigmoid gating, an optional selection bias, optional renormalisation and scale) plus shared
experts.

The file's ``attention.key_length`` / ``value_length`` are the cache row and the latent (576 /
512); ``key_length_mla`` / ``value_length_mla`` a head's query and value dims (192 / 128).
YaRN rope scaling (DeepSeek-V2's long context, `attn.rope_scaling`): the file's
``rope.scaling.yarn_log_multiplier`` is 0.1 mscale_all_dim; as llama.cpp does, the rope's own
magnitude cancels to 1 and the softmax scale becomes ``mscale^2 / sqrt(192)``, mscale =
``1 + 0.1 mscale_all_dim ln(factor)``.
"""

import math
from typing import Any

import numpy as np

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError
from loraserve.model.attn.rope_scaling import read_scaling

_GATING = {0: "softmax", 1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def _attn(keys: Keys, qk: int) -> dict[str, Any]:
    """The rope scaling and softmax scale (deepseek2.cpp's kq_scale), in float32 as there."""
    f32 = np.float32
    log_mul = float(f32(keys.get("rope.scaling.yarn_log_multiplier", 0.0)) / f32(0.1))
    rs = read_scaling(keys, int(keys.get("context_length", 2048)), log_mul, True)
    ln = f32(math.log(1.0 / rs.freq_scale))
    org = f32(rs.attn_factor) * (f32(1.0) + f32(0.1) * ln)
    mscale = org * (f32(1.0) + f32(0.1) * f32(log_mul) * ln)
    return {"rope_scaling": rs, "attn_scale": float(mscale * mscale / f32(math.sqrt(qk)))}


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
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
        **_attn(keys, qk),
        moe_layers=tuple(i >= lead for i in range(n_layers)),
        expert_gating=_GATING[gating],
        expert_norm=bool(keys.get("expert_weights_norm", False)),
        expert_scale=float(keys.get("expert_weights_scale", 0.0) or 0.0),
    )


# rope="neox": the latent attention reorders its own rope rows (llama.cpp rotates adjacent
# pairs); the generic q/k unpermutation of "norm" architectures must not touch attn_q
ARCH = Arch(name="deepseek2", rope="neox", experts="required", partial_rope=True, gguf=_gguf)
