"""mamba2 (llama.cpp src/models/mamba.cpp with ``build_mamba2_layer``): a Mamba-2 mixer
(`recurrent.Mamba2`) in every layer, pre-normed, with its residual and no FFN."""

from collections.abc import Mapping
from typing import Any

from loraserve.model.archs.base import Arch, Keys
from loraserve.model.archs.granitehybrid import mamba2

# llama.cpp's converter writes these 0 ("unused, but seemingly required when loading") and no
# head_count_kv: Mamba-2 alone has neither attention nor FFN, and llama.cpp loads such files
UNUSED = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")


def with_placeholders(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """``meta`` with a mamba2 file's unused attention and FFN sizes read as 1 where it has 0 or
    none (every other file as it is), so the checks of sizes other layers use pass."""
    if meta.get("general.architecture") != "mamba2":
        return meta
    return {**meta, **{f"mamba2.{k}": 1 for k in UNUSED if not meta.get(f"mamba2.{k}")}}


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return mamba2(keys, n_layers) | {
        "layer_kinds": ("mamba2",) * n_layers,
        "ffn_layers": (False,) * n_layers,
    }


ARCH = Arch(name="mamba2", recurrent=True, gguf=_gguf)
