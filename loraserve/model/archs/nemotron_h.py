"""nemotron_h (llama.cpp src/models/nemotron-h.cpp): each layer is one of three kinds, after
its own ``attn_norm`` and with its residual: a Mamba-2 mixer (`recurrent.Mamba2`) where the
per-layer KV head count and FFN width are both 0, attention without rope (output bias where
the file has one) where only the FFN width is 0, and otherwise an FFN alone (layer kind "ffn":
relu(up x)^2 projected down, biases where present, no gate). Its RMS norms' epsilon is
``attention.layer_norm_rms_epsilon``, else ``attention.layer_norm_epsilon`` as llama.cpp reads
it: convert_hf_to_gguf writes only the latter."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError
from loraserve.model.archs.falcon_h1 import ssm_sizes


def per_layer(keys: Keys, key: str, n_layers: int) -> list[int]:
    v = keys.req(key)
    return [int(x) for x in v] if hasattr(v, "__len__") else [int(v)] * n_layers


def layers(keys: Keys, n_layers: int) -> dict[str, Any]:
    """Layer kinds from the per-layer KV head counts and FFN widths (nemotron_h, _moe)."""
    kv = per_layer(keys, "attention.head_count_kv", n_layers)
    ff = per_layer(keys, "feed_forward_length", n_layers)
    if len(kv) != n_layers or len(ff) != n_layers:
        raise UnsupportedModelError(f"{keys.arch}: per-layer counts must have {n_layers} entries")
    kinds = tuple("mamba2" if k == 0 and f == 0 else "attn" if f == 0 else "ffn"
                  for k, f in zip(kv, ff, strict=True))  # fmt: skip
    eps = keys.get("attention.layer_norm_rms_epsilon", None)
    return dict(
        rms_eps=float(keys.req("attention.layer_norm_epsilon") if eps is None else eps),
        layer_kinds=kinds,
        ssm=ssm_sizes(keys),
        ffn_layers=tuple(k == "ffn" for k in kinds),
        rope_layers=(False,) * n_layers,
        act="relu_sqr",
        ffn_kind="plain",
    )


ARCH = Arch(name="nemotron_h", recurrent=True, gguf=layers)
