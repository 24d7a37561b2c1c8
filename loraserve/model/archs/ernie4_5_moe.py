"""ernie4_5-moe (llama.cpp src/models/ernie4-5-moe.cpp): llama's attention (rope on adjacent
pairs); the first ``leading_dense_block_count`` layers dense, then routed experts on every
``interleave_moe_layer_step``-th layer (softmax, selection bias ``exp_probs_b``, weights
renormalised) plus shared experts where the file has them. llama.cpp's graph adds no
``attn_output.bias`` (it passes NULL), whatever the file holds."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    lead = int(keys.get("leading_dense_block_count", 0))
    step = max(1, int(keys.get("interleave_moe_layer_step", 1)))
    return {"moe_layers": tuple(i >= lead and (i + 1) % step == 0 for i in range(n_layers))}


ARCH = Arch(name="ernie4_5-moe", hf_types=("ernie4_5_moe",), rope="norm", experts="required",
            unused_biases=("attn_output",), gguf=_gguf)  # fmt: skip
