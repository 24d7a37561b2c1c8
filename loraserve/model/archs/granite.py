"""granite (llama.cpp src/models/granite.cpp): llama's layers with its multipliers: embeddings
times ``embedding_scale``, each branch's output times ``residual_scale`` before its residual add,
the softmax scale ``attention.scale``, the logits divided by ``logit_scale``; rope on adjacent
pairs in every layer unless ``rope.scaling.finetuned`` is false (then none)."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def multipliers(keys: Keys, n_layers: int) -> dict[str, Any]:
    """Granite's multipliers (granite, granitemoe), each only where the file sets it (the
    switch of rope by ``rope.scaling.finetuned`` is granite's alone)."""
    out: dict[str, Any] = {}
    if float(keys.get("embedding_scale", 0.0)):
        out["embed_scale"] = float(keys.get("embedding_scale"))
    if float(keys.get("residual_scale", 0.0)):
        out["residual_scale"] = float(keys.get("residual_scale"))
    if float(keys.get("attention.scale", 0.0)):
        out["attn_scale"] = float(keys.get("attention.scale"))
    out["logit_scale"] = float(1.0 / float(keys.req("logit_scale")))
    return out


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    rope = bool(keys.get("rope.scaling.finetuned", True))  # granite's switch for rope
    return multipliers(keys, n_layers) | {"rope_layers": (rope,) * n_layers}


ARCH = Arch(name="granite", hf_types=("granite",), rope="norm", experts="optional",
            gguf=_gguf)  # fmt: skip
