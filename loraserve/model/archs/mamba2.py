"""mamba2 (llama.cpp src/models/mamba.cpp with ``build_mamba2_layer``): a Mamba-2 mixer
(`recurrent.Mamba2`) in every layer, pre-normed, with its residual and no FFN."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys
from loraserve.model.archs.granitehybrid import mamba2


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return mamba2(keys, n_layers) | {
        "layer_kinds": ("mamba2",) * n_layers,
        "ffn_layers": (False,) * n_layers,
    }


ARCH = Arch(name="mamba2", recurrent=True, gguf=_gguf)
