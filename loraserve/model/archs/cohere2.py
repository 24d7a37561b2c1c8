"""cohere2 (llama.cpp src/models/cohere2.cpp): attention and FFN in parallel on one LayerNorm
of the input (both added to the residual), three sliding-window layers to one global, rope
(on adjacent pairs) on the sliding layers only, output tied and the logits scaled by
``logit_scale``."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, swa_layers


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    sliding = swa_layers(keys, n_layers, 4)
    base = float(keys.get("rope.freq_base", 10000.0))
    return dict(
        local_rope_scaled=True,  # llama.cpp: rope_freq_scale_train_swa = the global one
        rope_theta_local=float(keys.get("rope.freq_base_swa", base)),
        sliding_window=int(keys.req("attention.sliding_window")),
        sliding_layers=sliding,
        rope_layers=sliding,
        rms_eps=float(keys.req("attention.layer_norm_epsilon")),
        norm="layer",
        parallel=True,
        logit_scale=float(keys.get("logit_scale", 1.0)),
        tied_output=True,
    )


ARCH = Arch(name="cohere2", hf_types=(), rope="norm", tied_default=True, gguf=_gguf)
