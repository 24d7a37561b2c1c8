"""llama4 (llama.cpp src/models/llama4.cpp): llama's layers (rope on adjacent pairs, with the
file's ``rope_freqs`` factors) where three layers of four attend in chunks of 8,192 positions
(a query sees only the keys of its own chunk) and every fourth layer has no rope; on those,
q is scaled by the position's attention temperature ``1 + 0.1 log(floor((pos + 1) / 8192) + 1)``;
on the rope layers q and k are RMS-normed without weight after rope (not in the 128-expert
model). Layers ``(i + 1) % interleave_moe_layer_step == 0`` route experts by sigmoid of the
router's logits (top-k by the logits, weights not renormalised), each chosen weight multiplying
the expert's input, plus one ungated shared expert; the others are dense.

A file whose ``attention.sliding_window`` is 0 has no chunks and no temperature, and (as
llama.cpp decides it) rope on every layer but the last. llama.cpp hard-codes the chunk size,
the temperature constants and the no-rope step; so does this.
"""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, swa_layers

_CHUNK, _NO_ROPE_STEP = 8192, 4


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    step = int(keys.get("interleave_moe_layer_step", 0) or 0)
    out: dict[str, Any] = dict(
        moe_layers=tuple(step > 0 and (i + 1) % step == 0 for i in range(n_layers)),
        expert_gating="sigmoid",
        expert_norm=False,
        expert_scale=0.0,
        expert_weight_input=True,
        qk_l2_norm=int(keys.get("expert_count", 0)) != 128,
    )
    window = keys.get("attention.sliding_window")
    if window is not None and int(window) == 0:
        out["rope_layers"] = tuple((i + 1) % n_layers != 0 for i in range(n_layers))
        return out
    base = float(keys.get("rope.freq_base", 10000.0))
    return out | dict(
        rope_layers=tuple((i + 1) % _NO_ROPE_STEP != 0 for i in range(n_layers)),
        sliding_layers=swa_layers(keys, n_layers, 4),
        attn_chunk=_CHUNK,
        attn_temp=(float(_CHUNK), 0.1, 1.0),  # floor scale, scale, position offset
        rope_theta_local=float(keys.get("rope.freq_base_swa", base)),
        local_rope_scaled=True,
    )


ARCH = Arch(name="llama4", hf_types=(), rope="norm", experts="required", gguf=_gguf)
