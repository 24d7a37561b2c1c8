"""exaone4 (llama.cpp src/models/exaone4.cpp): no norm before attention or FFN, an RMSNorm on
each one's output instead; per-head RMSNorm of q and k before rope on halves. The 32B model
(64 layers) slides a 4096 window on three layers of four, with rope only on those; the smaller
ones use global attention with rope everywhere."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, swa_layers


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    out: dict[str, Any] = {"pre_norms": False}
    if n_layers == 64:  # as llama.cpp decides it
        sliding = swa_layers(keys, n_layers, 4)
        base = float(keys.get("rope.freq_base", 10000.0))
        out.update(
            sliding_window=int(keys.get("attention.sliding_window", 4096)),
            sliding_layers=sliding,
            rope_layers=sliding,
            rope_theta_local=float(keys.get("rope.freq_base_swa", base)),
            local_rope_scaled=True,
        )
    return out


ARCH = Arch(name="exaone4", hf_types=("exaone4",), qk_norm=True, post_norms=True, gguf=_gguf)
