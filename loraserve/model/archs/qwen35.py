"""qwen35 (Qwen3.5 dense; llama.cpp src/models/qwen35.cpp): gated delta-net layers
(`recurrent.GatedDeltaNet`, ``ssm_beta``/``ssm_alpha``) where ``attention.recurrent_layers``
says so, else every layer but each ``full_attention_interval``-th; gated attention elsewhere
(each head's query then its output gate in ``attn_q``, per-head q/k RMSNorm, rope on halves:
llama.cpp's interleaved M-RoPE, the same rotation for text positions; the output times
sigmoid(gate)); a SiLU-gated FFN after the norm stored as ``post_attention_norm``."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def deltanet(keys: Keys, n_layers: int) -> dict[str, Any]:
    """Layer kinds (delta-net or attention), the delta-net sizes, the gated attention and the
    pre-FFN norm's name (qwen35, qwen35moe, qwen3next). The multi-token-prediction blocks
    (``nextn_predict_layers``) at the end are not layers of the model: loaded by llama-server
    for its MTP draft only, never run in the main pass; validation skips their tensors."""
    n_layers -= int(keys.get("nextn_predict_layers", 0) or 0)
    recr = keys.get("attention.recurrent_layers")
    if recr is not None and hasattr(recr, "__len__") and len(recr) >= n_layers:
        is_recr = [bool(x) for x in list(recr)[:n_layers]]
    else:
        every = int(keys.get("full_attention_interval", 4) or 4)
        is_recr = [(i + 1) % every != 0 for i in range(n_layers)]
    names = ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")
    return dict(
        n_layers=n_layers,
        layer_kinds=tuple("deltanet" if r else "attn" for r in is_recr),
        ssm=tuple(int(keys.req(f"ssm.{k}")) for k in names),
        attn_out_gate=True,
        ffn_norm_name="post_attention_norm",
    )


ARCH = Arch(name="qwen35", qk_norm=True, recurrent=True, gguf=deltanet)
