"""Every tensor of a GGUF model against its configuration (`check_tensors`: shapes per layer
from `shapes.SHAPES`, none missing, the embedding and output against the hidden size and the
tokenizer) and every matrix's type against the kernels' (`check_types`); part of
`validate.gguf_config`'s whole-file check, `ModelFileError` naming the first tensor that does
not fit."""

from __future__ import annotations

import re
from collections.abc import Mapping

from loraserve.model.config import ModelConfig
from loraserve.model.shapes import SHAPES, Shape, ShapeFn, ffn_width, heads, required_stems
from loraserve.model.validate_common import ModelFileError

# blk.N.STEM.weight / .bias, or a bare blk.N.STEM (falcon-h1's ffn_norm, llama.cpp's ssm_a)
BLOCK = re.compile(r"^blk\.(\d+)\.(.+?)(?:\.(weight|bias))?$")


def check_tensors(
    cfg: ModelConfig,
    shapes: Mapping[str, Shape],
    n_tokens: int | None,
    extra: Mapping[str, ShapeFn] | None = None,
) -> None:
    """Every tensor's shape (``shapes``: name -> torch-order shape) against ``cfg``: each
    layer's tensors against `SHAPES` (plus ``extra``), none missing that the layer needs, no
    block past the last layer, the embedding, output norm and output against the hidden size,
    and their rows against the tokenizer's ``n_tokens`` (when known); `ModelFileError`
    naming the first tensor that does not fit."""
    from loraserve.model.recurrent import tensors as recurrent_tensors

    table = {**SHAPES, **(extra or {})}
    h = cfg.hidden_size
    for name, shape in shapes.items():
        m = BLOCK.match(name)
        if m is None:
            continue
        i, stem, kind = int(m.group(1)), m.group(2), m.group(3)
        if i >= cfg.n_layers:
            raise ModelFileError(f"tensor {name!r} is past the last of {cfg.n_layers} layers")
        if kind == "bias":
            w = shapes.get(f"blk.{i}.{stem}.weight")
            want = tuple(w[:2]) if w is not None and len(w) == 3 else None  # experts' [E, rows]
            if w is not None and tuple(shape) != (want or (w[-2] if len(w) >= 2 else w[0],)):
                raise ModelFileError(
                    f"tensor {name!r} has shape {tuple(shape)}, expected one value per row of "
                    f"its weight {tuple(w)}"
                )
            continue
        fn = table.get(stem)
        if fn is not None and tuple(shape) != (want := tuple(fn(cfg, i))):
            if stem == "ssm_norm" and recurrent_tensors.ggml_shape(
                shape
            ) == recurrent_tensors.ggml_shape(want):
                continue  # one group's [1, d] stored as [d] by llama-quantize
            raise ModelFileError(_mismatch(name, shape, want, cfg, i))
    for i in range(cfg.n_layers):
        fused_exps = f"blk.{i}.ffn_gate_up_exps.weight" in shapes  # gate|up in one (deepseek2)
        stems = required_stems(cfg, i)
        fused_qkv = "attn_q" in stems and f"blk.{i}.attn_qkv.weight" in shapes  # phi3's files
        if fused_qkv:
            _check_fused_qkv(cfg, i, shapes, table)
        for stem in stems:
            if fused_exps and stem in ("ffn_gate_exps", "ffn_up_exps"):
                continue
            if fused_qkv and stem in ("attn_q", "attn_k", "attn_v"):
                continue
            if f"blk.{i}.{stem}.weight" not in shapes and f"blk.{i}.{stem}" not in shapes:
                raise ModelFileError(f"the model lacks tensor 'blk.{i}.{stem}.weight'")
    if (problem := recurrent_tensors.check(cfg, shapes)) is not None:
        raise ModelFileError(problem)
    emb = shapes.get("token_embd.weight")
    if emb is None or len(emb) != 2 or emb[1] != h:
        raise ModelFileError(
            f"token_embd.weight has shape {emb and tuple(emb)}, expected [vocab, {h}]"
        )
    out_norm = cfg.tensor("output_norm") + ".weight"  # lfm2: token_embd_norm
    norm = shapes.get(out_norm)
    if norm is None or tuple(norm) != (h,):
        raise ModelFileError(f"{out_norm} has shape {norm and tuple(norm)}, expected [{h}]")
    if n_tokens is not None and emb[0] < n_tokens:
        raise ModelFileError(
            f"token_embd.weight has {emb[0]} rows for a tokenizer of {n_tokens} tokens"
        )
    out = shapes.get("output.weight")
    if out is not None and tuple(out) != tuple(emb):
        raise ModelFileError(
            f"output.weight has shape {tuple(out)}, expected the embedding's {tuple(emb)}"
        )


def _check_fused_qkv(
    cfg: ModelConfig, i: int, shapes: Mapping[str, Shape], table: Mapping[str, ShapeFn]
) -> None:
    """Layer i's one ``attn_qkv`` (q|k|v rows, as llama.cpp's ``create_tensor_qkv`` takes it
    first: phi3's converted files) against the q, k and v shapes it stands for."""
    name = f"blk.{i}.attn_qkv.weight"
    parts = [tuple(table[s](cfg, i)) for s in ("attn_q", "attn_k", "attn_v")]
    want = (sum(p[0] for p in parts), cfg.hidden_size)
    if tuple(shapes[name]) != want:
        raise ModelFileError(_mismatch(name, shapes[name], want, cfg, i))


def _mismatch(name: str, shape: Shape, want: Shape, cfg: ModelConfig, i: int) -> str:
    _, nq, nkv, d, _ = heads(cfg, i)
    return (
        f"tensor {name!r} has shape {tuple(shape)}, but the configuration expects "
        f"{want} (hidden {cfg.hidden_size}, {nq} heads, {nkv} KV heads of {d}, FFN "
        f"{ffn_width(cfg, i)}): the metadata does not describe these weights"
    )


def check_types(types: Mapping[str, int], shapes: Mapping[str, Shape]) -> None:
    """Every matrix (2-D or 3-D tensor) has a type the matmul kernels run (`MATRIX_TYPES`);
    vectors are dequantized, whose own check names an unknown type."""
    from loraserve.model.dequant import type_name

    for name, t in types.items():
        if len(shapes[name]) >= 2 and t not in MATRIX_TYPES:
            raise ModelFileError(
                f"tensor {name!r} has ggml type {type_name(t)}, which loraserve has no kernel "
                f"for; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, "
                f"IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, "
                f"IQ1_S, IQ1_M"
            )


# kernels.QUANT_TYPES and the float types (kept literal: validation imports no kernels)
MATRIX_TYPES = frozenset({0, 1, 30, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 34, 35, 39, 16, 17,
                          18, 19, 21, 22, 29})  # fmt: skip
