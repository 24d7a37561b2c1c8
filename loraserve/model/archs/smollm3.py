"""smollm3 (llama.cpp src/models/smollm3.cpp): llama's layers (rope on adjacent pairs), except
that every fourth layer has no rope at all (llama.cpp hard-codes the step, 4)."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return {"rope_layers": tuple((i + 1) % 4 != 0 for i in range(n_layers))}


ARCH = Arch(name="smollm3", hf_types=("smollm3",), rope="norm", gguf=_gguf)
