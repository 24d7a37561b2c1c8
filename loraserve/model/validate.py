"""A GGUF model checked whole before any kernel sees a weight: its hyper-parameters (types and
ranges), the configuration derived from them, every tensor's shape against what the layers
will use, per layer, and the embedding and output against the tokenizer.

`gguf_config` is the one call the loader (and the start-up pre-flight) makes: it derives the
`ModelConfig` and raises `ModelFileError`, one line naming the file and the first problem,
for anything that does not fit. The file's own structure (types, offsets, extents, metadata
bounds) is `GGUFFile`'s check (`gguf.py`).

Expected shapes come from `shapes.SHAPES`: a tensor stem (``attn_q``, ``ffn_down``, ...) -> a
function of the config and the layer index giving the shape in torch order ([out, in] for a
matrix). It reads the config's per-layer values where it has them (`per_layer`: a field that
is a tuple holds one value per layer), so an architecture with layers of different widths is
checked layer by layer. An architecture file extends the table with its own stems (``extra``
of `check_tensors`, or entries added to `SHAPES`); a stem the table does not know is left to
the layer that reads it (its structure was checked with the file). A bias
(``blk.N.STEM.bias``) must be one value per row of its weight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from loraserve.model.archs.mamba2 import with_placeholders as mamba2_placeholders
from loraserve.model.config import ModelConfig, UnsupportedModelError
from loraserve.model.shapes import (
    ShapeFn,
    ffn_width,
    has_ffn,
    heads,
    is_moe,
    layer_ffn_width,
)
from loraserve.model.validate_common import (  # ModelFileError re-exported: importers use it
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    ModelFileError,
)
from loraserve.model.validate_common import is_int as _is_int
from loraserve.model.validate_common import show_value as _show
from loraserve.model.validate_tensors import BLOCK, check_tensors, check_types
from loraserve.model.validate_tokenizer import check_tokenizer

# ---- hyper-parameters --------------------------------------------------------------------

# <arch>.KEY -> (lowest, highest) for the integer keys every architecture reads
_INT_KEYS = {
    "block_count": (1, MAX_LAYERS),
    "embedding_length": (1, MAX_WIDTH),
    "feed_forward_length": (1, MAX_WIDTH),
    "attention.head_count": (1, MAX_WIDTH),
    "attention.head_count_kv": (1, MAX_WIDTH),
    "attention.key_length": (1, MAX_WIDTH),
    "attention.value_length": (1, MAX_WIDTH),
    "context_length": (1, MAX_CONTEXT),
    "vocab_size": (1, MAX_VOCAB),
    "expert_count": (0, MAX_EXPERTS),
    "expert_used_count": (0, MAX_EXPERTS),
    "expert_feed_forward_length": (0, MAX_WIDTH),
    "attention.sliding_window": (0, MAX_CONTEXT),
}
_FLOAT_KEYS = ("attention.layer_norm_rms_epsilon", "rope.freq_base")


def check_hparams(meta: Mapping[str, Any]) -> None:
    """The hyper-parameter keys of ``general.architecture`` have the right types and sane
    ranges (integer scalars, finite positive floats); `ModelFileError` otherwise."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"general.architecture must be a string, got {_show(arch)}")
    for key, (lo, hi) in _INT_KEYS.items():
        v = meta.get(f"{arch}.{key}")
        per_layer = key.startswith("attention.head_count") or key == "feed_forward_length"
        if per_layer and _per_layer_heads(arch, v):
            continue  # one per layer, 0 at recurrent layers (`ModelConfig.from_gguf` reads them)
        if v is not None and not (_is_int(v) and lo <= int(v) <= hi):
            raise ModelFileError(f"{arch}.{key} = {_show(v)}: must be an integer from {lo} to {hi}")
    for key in _FLOAT_KEYS:
        v = meta.get(f"{arch}.{key}")
        if v is not None and not (
            isinstance(v, (int, float, np.number))
            and math.isfinite(float(v))
            and (float(v) > 0 or (key.endswith("epsilon") and float(v) == 0))
        ):  # an epsilon of 0: an architecture with LayerNorm (cohere2) leaves the RMS one 0
            raise ModelFileError(f"{arch}.{key} = {_show(v)}: must be a finite positive number")


def _per_layer_heads(arch: str, v: Any) -> bool:
    """Whether ``v`` is a valid per-layer head count of a recurrent architecture."""
    from loraserve.model import archs

    a = archs.ARCHS.get(arch)
    if a is None or not a.recurrent or not isinstance(v, (list, np.ndarray)):
        return False
    if len(v) > MAX_LAYERS or not all(_is_int(x) and 0 <= int(x) <= MAX_WIDTH for x in v):
        raise ModelFileError(f"{arch} per-layer head counts {_show(v)}: integers 0 to {MAX_WIDTH}")
    return True


def check_config(cfg: ModelConfig) -> None:
    """The derived configuration is one the layers can run (positive, bounded widths, heads
    that group, an even head dim for rope, experts that route); `ModelFileError` otherwise."""
    if not 1 <= cfg.n_layers <= MAX_LAYERS:
        raise ModelFileError(f"{cfg.n_layers} layers (1 to {MAX_LAYERS})")
    if not 1 <= cfg.hidden_size <= MAX_WIDTH:
        raise ModelFileError(f"hidden size {cfg.hidden_size} (1 to {MAX_WIDTH})")
    for i in range(cfg.n_layers):
        h, nq, nkv, d, dv = heads(cfg, i)
        where = f"layer {i}: "
        ffn = has_ffn(cfg, i)
        moe = ffn and is_moe(cfg, i)
        # a dense width of 0: the key left out where no layer has a dense FFN (ffn_optional)
        dense = ffn_width(cfg, i) if ffn and (cfg.ffn_dim or not moe) else 1
        experts = layer_ffn_width(cfg, i) if moe else 1
        for what, v in (("heads", nq), ("KV heads", nkv), ("head dim", d), ("value dim", dv),
                        ("FFN width", dense), ("experts' width", experts)):  # fmt: skip
            if not (_is_int(v) and 1 <= v <= MAX_WIDTH):
                raise ModelFileError(f"{where}{what} = {_show(v)} (1 to {MAX_WIDTH})")
        if nq % nkv:
            raise ModelFileError(f"{where}{nq} heads are not a multiple of {nkv} KV heads")
        if d % 2:
            raise ModelFileError(f"{where}head dim {d} is odd: rope rotates halves")
        if nq * d > MAX_WIDTH:
            raise ModelFileError(f"{where}{nq} heads x {d} exceed {MAX_WIDTH} columns")
    n_exp, used = getattr(cfg, "n_experts", 0), getattr(cfg, "n_experts_used", 0)
    if not 0 <= n_exp <= MAX_EXPERTS or (n_exp and not 1 <= used <= n_exp):
        raise ModelFileError(f"{n_exp} experts with {used} used per token")
    for what, v in (("RMSNorm epsilon", cfg.rms_eps), ("rope base", cfg.rope_theta),
                    ("local rope base", cfg.rope_theta_local), ("attention scale", cfg.attn_scale),
                    ("embedding scale", cfg.embed_scale)):  # fmt: skip
        if not (math.isfinite(v) and v > 0):
            raise ModelFileError(f"{what} {v} must be finite and positive")
    if not 1 <= cfg.context_length <= MAX_CONTEXT or cfg.sliding_window < 0:
        raise ModelFileError(
            f"context length {cfg.context_length}, sliding window {cfg.sliding_window}"
        )


# ---- the one call ------------------------------------------------------------------------


def _without_nextn(meta: Mapping[str, Any], cfg: ModelConfig, table: dict[str, Any]) -> dict:
    """``table`` without the multi-token-prediction blocks (``nextn_predict_layers``) that
    follow the last layer where the architecture ran fewer layers than ``block_count`` for
    them (qwen35, glm4moe): llama-server loads them only for its MTP draft and never runs
    them in the main pass, so they are skipped, not refused."""
    arch = meta.get("general.architecture")
    nextn = int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0)
    if nextn <= 0 or int(meta.get(f"{arch}.block_count", 0) or 0) != cfg.n_layers + nextn:
        return table
    out = {}
    for name, v in table.items():
        m = BLOCK.match(name)
        if m is None or not cfg.n_layers <= int(m.group(1)) < cfg.n_layers + nextn:
            out[name] = v
    return out


def gguf_config(
    path: str | Path,
    meta: Mapping[str, Any],
    tensors: Mapping[str, Any],
    extra: Mapping[str, ShapeFn] | None = None,
) -> ModelConfig:
    """The `ModelConfig` of a GGUF model (metadata ``meta``; ``tensors`` by name: the file's
    tensor table, `GGUFTensorInfo` each, or plain shapes), its vocabulary the embedding's rows,
    after every check of this module; `ModelFileError` naming ``path`` and the first problem
    (an unsupported architecture stays `UnsupportedModelError`)."""
    shapes = {n: tuple(getattr(t, "shape", t)) for n, t in tensors.items()}
    types = {n: t.ggml_type for n, t in tensors.items() if hasattr(t, "ggml_type")}
    try:
        n_tokens = check_tokenizer(meta)
        meta = mamba2_placeholders(meta)  # converted mamba2 files: attention/FFN sizes 0
        check_hparams(meta)
        try:
            cfg = ModelConfig.from_gguf(dict(meta), set(shapes))
        except UnsupportedModelError as e:
            raise UnsupportedModelError(f"{path}: {e}") from None
        except (ValueError, TypeError, ArithmeticError, KeyError, IndexError) as e:
            raise ModelFileError(f"unusable hyper-parameters: {e}") from None
        emb = shapes.get("token_embd.weight")
        if emb is not None and len(emb) == 2 and emb[0] != cfg.vocab_size:
            cfg = replace(cfg, vocab_size=emb[0])
        check_config(cfg)
        shapes, types = _without_nextn(meta, cfg, shapes), _without_nextn(meta, cfg, types)
        check_tensors(cfg, shapes, n_tokens, extra)
        check_types(types, shapes)
    except ModelFileError as e:
        raise ModelFileError(f"{path}: {e}") from None
    return cfg
