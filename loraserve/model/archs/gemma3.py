"""gemma3 (llama.cpp src/models/gemma3.cpp): 5 sliding-window layers to 1 global, q/k norms,
norms on both sides of attention and FFN, GELU-tanh gated FFN, embeddings scaled by sqrt(hidden).

Not stored in GGUF: llama.cpp and transformers hard-code the sliding layers' rope base (10,000)
and the layer pattern (global at every sixth layer).
"""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return dict(
        rope_theta_local=10000.0,
        sliding_window=int(keys.get("attention.sliding_window", 512)),
        sliding_layers=tuple((i + 1) % 6 != 0 for i in range(n_layers)),
    )


def _hf(cfg: dict[str, Any], n_layers: int) -> dict[str, Any]:
    layer_types = cfg.get("layer_types")
    if layer_types:
        sliding = tuple(t == "sliding_attention" for t in layer_types)
    else:
        pattern = int(cfg.get("sliding_window_pattern", 6))
        sliding = tuple((i + 1) % pattern != 0 for i in range(n_layers))
    rp = cfg.get("rope_parameters") or {}
    local = cfg.get("rope_local_base_freq") or rp.get("sliding_attention", {}).get(
        "rope_theta", 10000.0
    )
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    return dict(
        rope_theta_local=float(local),
        sliding_window=int(cfg.get("sliding_window") or 512),
        sliding_layers=sliding,
        attn_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5,
    )


ARCH = Arch(
    name="gemma3",
    hf_types=("gemma3", "gemma3_text"),
    qk_norm=True,
    post_norms=True,
    act="gelu_tanh",
    embed_scale_sqrt=True,
    tied_default=True,
    gguf=_gguf,
    hf=_hf,
)
