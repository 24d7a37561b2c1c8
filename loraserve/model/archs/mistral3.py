"""mistral3 (llama.cpp src/models/mistral3.cpp): llama's layers (rope on adjacent pairs, dense
or softmax-routed experts), with the softmax scale from ``attention.scale`` when set.

convert_hf_to_gguf writes Ministral 3's YaRN ``mscale_all_dim`` as
``rope.scaling.yarn_log_multiplier`` (1.0), which llama.cpp's mistral3 loader reads as
``rope_yarn_log_mul``: the YaRN magnitude becomes get_mscale(f, 1) / get_mscale(f, log_mul)
(1 for 1.0) instead of get_mscale(f, 1). Its ``attention.temperature_scale`` s multiplies every
layer's q after rope by 1 + s log(floor(pos / n_ctx_orig) + 1), n_ctx_orig the original
context (``rope.scaling.original_context_length``, else ``context_length``): exactly 1 below
it (16,384 positions for Ministral 3), where the fused decode layers run without it."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, UnsupportedModelError
from loraserve.model.attn.rope_scaling import read_scaling


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    scale = float(keys.get("attention.scale", 0.0))
    if scale:
        out["attn_scale"] = scale
    temp = float(keys.get("attention.temperature_scale", 0.0) or 0.0)
    if temp:  # llama.cpp's floor scale: n_ctx_orig_yarn, the rope scaling's original context
        orig = read_scaling(keys, int(keys.get("context_length", 0) or 0)).ctx_orig
        if orig < 1:
            raise UnsupportedModelError("mistral3: attention temperature with no original context")
        out["attn_temp"], out["attn_temp_all"] = (float(orig), temp, 0.0), True
    log_mul = float(keys.get("rope.scaling.yarn_log_multiplier", 0.0))
    if log_mul:
        out["rope_scaling"] = read_scaling(keys, int(keys.get("context_length", 2048)), log_mul)
    return out


ARCH = Arch(name="mistral3", rope="norm", experts="optional", gguf=_gguf)
