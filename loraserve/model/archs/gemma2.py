"""gemma2 (llama.cpp src/models/gemma2.cpp): sliding-window and global layers alternating,
attention scores and final logits soft-capped (cap * tanh(s / cap)), norms on both sides of
attention and FFN, GELU-tanh gated FFN, embeddings scaled by sqrt(hidden), output tied.

The 27B model (46 layers) scales queries by 1/sqrt(hidden / heads), the others by
1/sqrt(head_dim), as llama.cpp hard-codes.
"""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, swa_layers


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    hidden, heads = int(keys.req("embedding_length")), int(keys.req("attention.head_count"))
    head_dim = int(keys.get("attention.key_length", 0)) or hidden // heads
    base = float(keys.get("rope.freq_base", 10000.0))
    return dict(
        local_rope_scaled=True,  # llama.cpp: rope_freq_scale_train_swa = the global one
        rope_theta_local=float(keys.get("rope.freq_base_swa", base)),
        sliding_window=int(keys.get("attention.sliding_window", 4096)),
        sliding_layers=swa_layers(keys, n_layers, 2),
        attn_softcap=float(keys.get("attn_logit_softcapping", 50.0)),
        final_softcap=float(keys.get("final_logit_softcapping", 30.0)),
        attn_scale=(hidden // heads if n_layers == 46 else head_dim) ** -0.5,
        tied_output=True,
    )


def _hf(cfg: dict[str, Any], n_layers: int) -> dict[str, Any]:
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    return dict(
        sliding_window=int(cfg.get("sliding_window") or 4096),
        sliding_layers=tuple(i % 2 == 0 for i in range(n_layers)),
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        attn_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5,
    )


ARCH = Arch(
    name="gemma2",
    hf_types=("gemma2",),
    post_norms=True,
    act="gelu_tanh",
    embed_scale_sqrt=True,
    tied_default=True,
    gguf=_gguf,
    hf=_hf,
)
