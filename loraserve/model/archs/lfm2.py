"""lfm2 (llama.cpp src/models/lfm2.cpp): short-convolution layers (`recurrent.ShortConv`, kernel
``shortconv.l_cache``) where the per-layer KV head count is 0, grouped-query attention with
per-head q/k norms and rope on halves elsewhere (sliding-window when the file sets a window),
a SiLU-gated FFN in every layer; the output norm is stored as ``token_embd_norm``."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def shortconv(keys: Keys, n_layers: int) -> dict[str, Any]:
    """Layer kinds (short convolution where the KV head count is 0), the kernel length, the
    output norm's name and the attention layers' window (lfm2, lfm2moe)."""
    kv = keys.req("attention.head_count_kv")
    kv = list(kv) if hasattr(kv, "__len__") else [kv] * n_layers
    kinds = tuple("shortconv" if int(n) == 0 else "attn" for n in kv)
    out: dict[str, Any] = dict(
        layer_kinds=kinds,
        conv_kernel=int(keys.req("shortconv.l_cache")),
        tensor_names=(("output_norm", "token_embd_norm"),),
    )
    window = int(keys.get("attention.sliding_window", 0) or 0)
    if window > 0:
        out |= dict(sliding_window=window, sliding_layers=tuple(k == "attn" for k in kinds))
    return out


ARCH = Arch(name="lfm2", qk_norm=True, recurrent=True, gguf=shortconv)
