"""jamba (llama.cpp src/models/jamba.cpp): Mamba-1 layers (`recurrent.Mamba1`, with its dt/B/C
RMS norms) where the per-layer KV head count is 0, attention without rope (q/k/v biases where
the file has them) elsewhere; every layer then has a SiLU-gated FFN after ``ffn_norm``: routed
experts where the layer has ``ffn_gate_inp`` (softmax routing over all experts, the top-k
weights not renormalised, times ``expert_weights_scale`` unless 0 or 1; each expert as wide as
``feed_forward_length``), a dense FFN elsewhere."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError
from loraserve.model.archs.falcon_h1 import ssm_sizes
from loraserve.model.archs.nemotron_h import per_layer


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    kv = per_layer(keys, "attention.head_count_kv", n_layers)
    if len(kv) != n_layers:
        raise UnsupportedModelError(f"jamba: per-layer counts must have {n_layers} entries")
    out = dict(
        layer_kinds=tuple("mamba1" if k == 0 else "attn" for k in kv),
        ssm=ssm_sizes(keys, groups=False),
        rope_layers=(False,) * n_layers,
    )
    if int(keys.get("expert_count", 0) or 0) > 0:
        moe = [f"blk.{i}.ffn_gate_inp.weight" in keys.tensors for i in range(n_layers)]
        out |= dict(
            moe_layers=tuple(moe) if keys.tensors else (True,) * n_layers,
            expert_ffn_dim=0,  # the experts are feed_forward_length wide (llama.cpp's n_ff)
            expert_gating="softmax",
            expert_norm=False,
            expert_scale=float(keys.get("expert_weights_scale", 0.0) or 0.0),
        )
    return out


ARCH = Arch(name="jamba", experts="optional", recurrent=True, gguf=_gguf)
