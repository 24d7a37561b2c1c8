"""olmo2 (llama.cpp src/models/olmo2.cpp): no norm before attention or FFN, an RMSNorm on each
one's output instead; q and k each RMS-normed over all their heads at once, rope on halves.
With ``attention.sliding_window`` set, three sliding-window layers to one global (llama.cpp's
default pattern, 4), the sliding ones on ``rope.freq_base_swa`` (else the global base)."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys, swa_layers


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    out: dict[str, Any] = {"qk_norm_mode": "full", "pre_norms": False}
    window = int(keys.get("attention.sliding_window", 0))
    if window > 0:
        base = float(keys.get("rope.freq_base", 10000.0))
        out.update(
            sliding_window=window,
            sliding_layers=swa_layers(keys, n_layers, 4),
            rope_theta_local=float(keys.get("rope.freq_base_swa", base)),
        )
    return out


ARCH = Arch(name="olmo2", hf_types=("olmo2",), qk_norm=True, post_norms=True, gguf=_gguf)
