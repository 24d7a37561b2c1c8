"""jamba (llama.cpp src/models/jamba.cpp): Mamba-1 layers (`recurrent.Mamba1`, with its dt/B/C
RMS norms) where the per-layer KV head count is 0, attention without rope (q/k/v biases where
the file has them) elsewhere; every layer then has a SiLU-gated FFN after ``ffn_norm``. Its
routed-expert layers (softmax routing, where a layer has ``ffn_gate_inp``) are not run yet: a
file with experts is refused by name."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError
from loraserve.model.archs.falcon_h1 import ssm_sizes
from loraserve.model.archs.nemotron_h import per_layer


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    if int(keys.get("expert_count", 0) or 0) > 0:
        raise UnsupportedModelError("jamba: routed experts are not supported yet")
    kv = per_layer(keys, "attention.head_count_kv", n_layers)
    if len(kv) != n_layers:
        raise UnsupportedModelError(f"jamba: per-layer counts must have {n_layers} entries")
    return dict(
        layer_kinds=tuple("mamba1" if k == 0 else "attn" for k in kv),
        ssm=ssm_sizes(keys, groups=False),
        rope_layers=(False,) * n_layers,
    )


ARCH = Arch(name="jamba", recurrent=True, gguf=_gguf)
