"""glm4 (llama.cpp src/models/glm4.cpp): pre- and post-norms around attention and FFN (as
gemma's, with SiLU), the FFN's gate and up stored as one ``ffn_up``; rope on adjacent pairs, or
on halves where the file carries M-RoPE sections (text positions: every section alike)."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    sections = keys.get("rope.dimension_sections")
    mrope = sections is not None and any(int(s) for s in sections)
    return {"rope_type": "neox" if mrope else "norm", "ffn_kind": "fused"}


ARCH = Arch(name="glm4", hf_types=("glm4",), rope="norm", post_norms=True, gguf=_gguf)
