"""nemotron_h_moe (llama.cpp src/models/nemotron-h.cpp, the loader and graph it shares with
nemotron_h): nemotron_h's layers, where each FFN layer with ``ffn_gate_inp`` runs routed
experts (`ffn.MoE`) instead of the dense FFN: sigmoid routing with the selection bias
``exp_probs_b`` (never in the weights), top-k weights renormalised when
``expert_weights_norm`` and times ``expert_weights_scale``; each expert relu(up x)^2 then down,
without a gate, ``expert_feed_forward_length`` wide (n_ff / k where the key is 0, as llama.cpp);
optionally in a latent space (``moe_latent_size``: ``ffn_latent_down`` before the experts,
``ffn_latent_up`` after, the router on the layer's input); plus one shared expert
(``ffn_{up,down}_shexp``, relu^2 without a gate) on every token, added."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError
from loraserve.model.archs.nemotron_h import layers, per_layer


def _uniform(keys: Keys, key: str, n_layers: int) -> int:
    """A count llama.cpp may store per layer (Nemotron Puzzle): one value for every layer."""
    if keys.get(key) is None:
        return 0
    vals = set(per_layer(keys, key, n_layers))
    if len(vals) > 1:
        raise UnsupportedModelError(f"{keys.arch}: per-layer {key} values are not supported")
    return vals.pop()


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    out = layers(keys, n_layers)
    n_experts = int(keys.get("expert_count", 0) or 0)
    if n_experts == 0:
        return out
    used = _uniform(keys, "expert_used_count", n_layers)
    kinds, ffn = out["layer_kinds"], per_layer(keys, "feed_forward_length", n_layers)
    moe = tuple(k == "ffn" and (not keys.tensors or f"blk.{i}.ffn_gate_inp.weight" in keys.tensors)
                for i, k in enumerate(kinds))  # fmt: skip
    width = _uniform(keys, "expert_feed_forward_length", n_layers)
    if width == 0 and used:  # llama.cpp: n_ff(i) / n_expert_used
        widths = {ffn[i] // used for i in range(n_layers) if moe[i]}
        if len(widths) > 1:
            raise UnsupportedModelError(f"{keys.arch}: expert widths differ between layers")
        width = widths.pop() if widths else 0
    return out | dict(
        n_experts_used=used,
        moe_layers=moe,
        expert_ffn_dim=width,
        expert_gating="sigmoid",
        expert_norm=bool(keys.get("expert_weights_norm", False)),
        expert_scale=float(keys.get("expert_weights_scale", 0.0) or 0.0),
        moe_latent=int(keys.get("moe_latent_size", 0) or 0),
    )


ARCH = Arch(name="nemotron_h_moe", experts="optional", recurrent=True, gguf=_gguf)
