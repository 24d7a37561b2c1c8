"""The tensor shapes a model configuration expects, per layer: `SHAPES` maps a tensor stem
(``attn_q``, ``ffn_down``, ...) to a function of the config and the layer index giving the
shape in torch order ([out, in] for a matrix), reading the config's per-layer values where it
has them (`per_layer`); `required_stems` names the tensors a layer cannot run without. Used by
`validate_tensors.check_tensors`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loraserve.model.config import ModelConfig

Shape = tuple[int, ...]
ShapeFn = Callable[[ModelConfig, int], Shape]


def per_layer(cfg: ModelConfig, name: str, i: int, default: Any = None) -> Any:
    """The config's ``name`` at layer ``i``: the field itself, or its i-th entry when the
    field holds one value per layer; ``default`` when the config has no such field."""
    v = getattr(cfg, name, default)
    return v[i] if isinstance(v, (tuple, list)) else v


def heads(c: ModelConfig, i: int) -> tuple[int, int, int, int, int]:
    """(hidden, q heads, kv heads, head dim, value head dim) at layer i."""
    d = per_layer(c, "head_dim", i)
    return (c.hidden_size, per_layer(c, "n_heads", i), per_layer(c, "n_kv_heads", i), d,
            per_layer(c, "head_dim_v", i, d) or d)  # fmt: skip


def has_ffn(c: ModelConfig, i: int) -> bool:
    return bool(per_layer(c, "ffn_layers", i, True))


def ffn_width(c: ModelConfig, i: int) -> int:
    return per_layer(c, "ffn_dim", i)


def _expert_ffn(c: ModelConfig, i: int) -> int:
    return per_layer(c, "expert_ffn_dim", i, 0) or ffn_width(c, i)


def is_moe(c: ModelConfig, i: int) -> bool:
    """Whether layer i's FFN is routed experts (`moe_layers`, else any experts at all)."""
    moe = per_layer(c, "moe_layers", i, None)
    return _n_experts(c, i) > 0 if moe is None else bool(moe)


def layer_ffn_width(c: ModelConfig, i: int) -> int:
    """The width layer i's FFN runs at: its experts' for a MoE layer, else the dense one."""
    return _expert_ffn(c, i) if is_moe(c, i) else ffn_width(c, i)


def _moe_io(c: ModelConfig) -> int:
    """The routed experts' input and output width: the latent one where the config has it."""
    return getattr(c, "moe_latent", 0) or c.hidden_size


def _n_experts(c: ModelConfig, i: int) -> int:
    return per_layer(c, "n_experts", i, 0)


def _v_width(c: ModelConfig, i: int) -> int:
    """A head's value width into the output projection (a latent head's: deepseek2)."""
    return getattr(c, "v_head_dim", 0) or heads(c, i)[4]


def _q_width(c: ModelConfig, i: int) -> int:
    """A head's query width: a latent head's is its no-rope and rope parts (deepseek2's
    ``attn_q`` without a q rank: V2-Lite), not the cache row ``head_dim``."""
    if getattr(c, "kv_lora_rank", 0):
        return c.qk_nope_dim + c.rope_dim
    if getattr(c, "attn_out_gate", False):  # the query, then its output gate (qwen35)
        return 2 * heads(c, i)[3]
    return heads(c, i)[3]


def _mamba1(c: ModelConfig, i: int) -> bool:
    return per_layer(c, "layer_kinds", i, "") == "mamba1"


def _ffn_kind(c: ModelConfig) -> str:
    return getattr(c, "ffn_kind", "gated")


def _qk_norm_width(c: ModelConfig, i: int, which: int) -> int:
    """A q (which 1) or k (2) norm's width: one head's, or all its heads' ("full")."""
    h = heads(c, i)
    return h[which] * h[3] if getattr(c, "qk_norm_mode", "head") == "full" else h[3]


def _dt_rows(c: ModelConfig, i: int) -> int:
    """ssm_in's dt rows: Mamba-2's one per head; none in a delta-net's (early qwen3next: q, k,
    v, z per key head)."""
    return 0 if per_layer(c, "layer_kinds", i, "") == "deltanet" else c.ssm[3]


# stem -> expected shape (torch order) at layer i
SHAPES: dict[str, ShapeFn] = {
    "attn_norm": lambda c, i: (c.hidden_size,),
    "attn_q": lambda c, i: (heads(c, i)[1] * _q_width(c, i), c.hidden_size),
    "attn_k": lambda c, i: (heads(c, i)[2] * heads(c, i)[3], c.hidden_size),
    "attn_v": lambda c, i: (heads(c, i)[2] * heads(c, i)[4], c.hidden_size),
    "attn_output": lambda c, i: (c.hidden_size, heads(c, i)[1] * _v_width(c, i)),
    "attn_kv_a_mqa": lambda c, i: (c.kv_lora_rank + c.rope_dim, c.hidden_size),
    "attn_q_norm": lambda c, i: (_qk_norm_width(c, i, 1),),
    "attn_k_norm": lambda c, i: (_qk_norm_width(c, i, 2),),
    "post_attention_norm": lambda c, i: (c.hidden_size,),
    "ffn_norm": lambda c, i: (c.hidden_size,),
    "post_ffw_norm": lambda c, i: (c.hidden_size,),
    "ffn_gate": lambda c, i: (ffn_width(c, i), c.hidden_size),
    "ffn_up": lambda c, i: (ffn_width(c, i) * (2 if _ffn_kind(c) == "fused" else 1), c.hidden_size),
    "ffn_down": lambda c, i: (c.hidden_size, ffn_width(c, i)),
    "ffn_gate_inp": lambda c, i: (_n_experts(c, i), c.hidden_size),
    "shortconv.in_proj": lambda c, i: (3 * c.hidden_size, c.hidden_size),
    "shortconv.out_proj": lambda c, i: (c.hidden_size, c.hidden_size),
    "shortconv.conv": lambda c, i: (c.hidden_size, c.conv_kernel),
    # Mamba-2: ssm = (d_conv, d_inner, d_state, heads, groups); Mamba-1's (jamba) differ, and
    # `recurrent.tensors` checks every Mamba tensor of a layer by its kind, bare names included
    "ssm_in": lambda c, i: (
        (2 * c.ssm[1], c.hidden_size)
        if _mamba1(c, i)
        else (2 * c.ssm[1] + 2 * c.ssm[4] * c.ssm[2] + _dt_rows(c, i), c.hidden_size)
    ),
    "ssm_out": lambda c, i: (c.hidden_size, c.ssm[1]),
    "ssm_conv1d": lambda c, i: (
        (c.ssm[1], c.ssm[0]) if _mamba1(c, i) else (c.ssm[1] + 2 * c.ssm[4] * c.ssm[2], c.ssm[0])
    ),
    "ssm_norm": lambda c, i: (
        (c.ssm[2],)  # the delta-net's: one value head's width
        if per_layer(c, "layer_kinds", i, "") == "deltanet"
        else (c.ssm[4], c.ssm[1] // c.ssm[4])
    ),
    "ffn_gate_exps": lambda c, i: (_n_experts(c, i), _expert_ffn(c, i), _moe_io(c)),
    "ffn_up_exps": lambda c, i: (_n_experts(c, i), _expert_ffn(c, i), _moe_io(c)),
    "ffn_down_exps": lambda c, i: (_n_experts(c, i), _moe_io(c), _expert_ffn(c, i)),
    "ffn_latent_down": lambda c, i: (_moe_io(c), c.hidden_size),
    "ffn_latent_up": lambda c, i: (c.hidden_size, _moe_io(c)),
}


def required_stems(cfg: ModelConfig, i: int) -> list[str]:
    """The stems layer ``i`` cannot run without, from the config's flags."""
    stems = ["attn_q", "attn_k", "attn_v", "attn_output"]
    kind = per_layer(cfg, "layer_kinds", i, "attn")
    if kind == "shortconv":  # a recurrent layer in place of attention (`model/recurrent/`)
        stems = ["shortconv.in_proj", "shortconv.out_proj", "shortconv.conv"]
    elif kind in ("mamba1", "mamba2", "ffn"):  # mixers' tensors: `recurrent.tensors`
        stems = []
    elif kind == "deltanet":  # shapes checked by `recurrent.deltanet` at load
        stems = ["ssm_out", "ssm_conv1d", "ssm_norm"]  # in-projections: attn_qkv or ssm_in
    elif getattr(cfg, "kv_lora_rank", 0):  # latent attention (deepseek2); q by attn_q or q_a/q_b
        stems = ["attn_kv_a_mqa", "attn_kv_a_norm", "attn_k_b", "attn_v_b", "attn_output"]
    if getattr(cfg, "pre_norms", True):  # olmo2, exaone4: post norms only
        stems += ["attn_norm"]
        if not getattr(cfg, "parallel", False) and has_ffn(cfg, i) and kind != "ffn":
            stems += [getattr(cfg, "ffn_norm_name", "ffn_norm")]
    if getattr(cfg, "qk_norm", False) and kind == "attn":
        stems += ["attn_q_norm", "attn_k_norm"]
    if getattr(cfg, "post_norms", False):
        stems += ["post_attention_norm", "post_ffw_norm"]
    if not has_ffn(cfg, i):  # the mixer and its residual alone (mamba2)
        pass
    elif is_moe(cfg, i):
        gate = [] if _ffn_kind(cfg) == "plain" else ["ffn_gate_exps"]  # plain: act(up) alone
        stems += ["ffn_gate_inp", *gate, "ffn_up_exps", "ffn_down_exps"]
        if getattr(cfg, "moe_latent", 0):
            stems += ["ffn_latent_down", "ffn_latent_up"]
    else:
        stems += (["ffn_gate"] if _ffn_kind(cfg) == "gated" else []) + ["ffn_up", "ffn_down"]
    return stems
