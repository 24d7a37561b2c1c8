"""granitehybrid (Granite 4; llama.cpp src/models/granite-hybrid.cpp): Mamba-2 layers
(`recurrent.Mamba2`) where the per-layer KV head count is 0, granite's attention elsewhere;
every layer has granite's FFN (dense, or softmax-routed experts with shared ones) and its
multipliers (embedding, residual, attention and logit scales; rope by
``rope.scaling.finetuned``)."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys
from loraserve.model.archs.granite import multipliers


def mamba2(keys: Keys, n_layers: int, kind: str = "mamba2") -> dict[str, Any]:
    """Layer kinds from the per-layer KV head counts (0: ``kind``) and the Mamba-2 sizes."""
    kv = keys.req("attention.head_count_kv")
    kv = list(kv) if hasattr(kv, "__len__") else [kv] * n_layers
    names = ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")
    ssm = tuple(int(keys.req(f"ssm.{k}")) for k in names)
    return dict(layer_kinds=tuple(kind if int(n) == 0 else "attn" for n in kv), ssm=ssm)


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    out = mamba2(keys, n_layers) | multipliers(keys, n_layers)
    rope = bool(keys.get("rope.scaling.finetuned", True))  # granite's switch for rope
    return out | {"rope_layers": (rope,) * n_layers}


ARCH = Arch(name="granitehybrid", rope="norm", experts="optional", recurrent=True, gguf=_gguf)
