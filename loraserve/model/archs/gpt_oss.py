"""gpt-oss (llama.cpp src/models/openai-moe.cpp): sliding-window and global layers
alternating, a learned sink logit per head in every softmax, biases on q, k, v and the output,
routed experts only (router and experts with biases; weights = softmax of the top-k router
logits) with the clamped SiLU gate ``swiglu_oai``. The pre-FFN norm is stored as
``post_attention_norm``. Real files hold the experts in MXFP4; the kernels here take the
other types (issue 32)."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, swa_layers


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    base = float(keys.get("rope.freq_base", 10000.0))
    return dict(
        local_rope_scaled=True,  # llama.cpp: rope_freq_scale_train_swa = the global one
        rope_theta_local=float(keys.get("rope.freq_base_swa", base)),
        sliding_window=int(keys.req("attention.sliding_window")),
        sliding_layers=swa_layers(keys, n_layers, 2),
        attn_sinks=True,
        ffn_norm_name="post_attention_norm",
        expert_gating="softmax_weight",
    )


ARCH = Arch(
    name="gpt-oss",
    hf_types=(),  # no Hugging Face reader yet
    qkv_bias=True,
    act="swiglu_oai",
    experts="required",
    gguf=_gguf,
)
