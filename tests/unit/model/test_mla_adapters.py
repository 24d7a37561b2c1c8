"""Adapters on latent attention with several heads (deepseek2 as DeepSeek-V2-Lite stores it:
``attn_k_b`` [H, rank, nope] and ``attn_v_b`` [H, v, rank] stacked per head, 3-D in the file).
The recorded tiny deepseek2 has one head, whose stacks are 2-D projections; here the same spec
with 3 heads takes a random GGUF LoRA on every projection, the per-head stacks included (A [H, r,
in], B [H, out, r], each head's delta as a stacked expert's), and the engine's answers with the
adapter equal the adapter merged into the float weights, as test_archs checks for every
architecture's recorded models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.lora.adapter_write import write_gguf_lora
from loraserve.lora.registry import base_shapes
from loraserve.model.gguf_write import write_gguf
from loraserve.model.loader import load_model
from tests.arch_models import tensor_values, typed_metadata, write_model
from tests.unit.model.archs_util import check_equals_merged
from tests.unit.model.mla_util import HEADS, mla_spec


def _pairs(spec: dict[str, Any], seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Random rank-4 pairs on every attention and FFN matrix, 2-D and per-head 3-D."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, _ in spec["tensors"]:
        stem = name.split(".")[-2] if name.startswith("blk.") else ""
        if not stem.startswith(("attn_", "ffn_")) or stem.endswith(("_norm", "_inp")):
            continue
        if len(shape) == 2:
            out[name] = (torch.randn(4, shape[1], generator=g) * 0.05,
                         torch.randn(shape[0], 4, generator=g) * 0.05)  # fmt: skip
        else:  # [H or E, out, in]
            out[name] = (torch.randn(shape[0], 4, shape[2], generator=g) * 0.05,
                         torch.randn(shape[0], shape[1], 4, generator=g) * 0.05)  # fmt: skip
    return out


def test_per_head_adapters_equal_merged_weights(tmp_path: Path) -> None:
    spec = mla_spec()
    model = load_model(write_model(spec, tmp_path / "ds2.gguf"))
    shapes = base_shapes(model.decoder)
    assert shapes["blk.0.attn_k_b.weight"] == (HEADS, 512, 128)  # adapters address the stacks
    assert shapes["blk.1.attn_v_b.weight"] == (HEADS, 128, 512)
    pairs = _pairs(spec, 1)
    assert "blk.1.attn_k_b.weight" in pairs and "blk.1.ffn_gate_up_exps.weight" in pairs
    write_gguf_lora(tmp_path / "a.gguf", "deepseek2", pairs, qk_heads=(HEADS, 1))
    values = tensor_values(spec)
    for name, (a, b) in pairs.items():
        values[name] = values[name] + 0.8 * (b.double() @ a.double()).float().numpy()
    merged = load_model(write_gguf(tmp_path / "merged.gguf", typed_metadata(spec["metadata"]),
                                   values))  # fmt: skip
    eng = Engine(model, EngineConfig(n_slots=2, n_ctx=512, block_size=16))
    eng.load_adapter(tmp_path / "a.gguf", 0.0).result()
    check_equals_merged(eng, model, merged, spec["answers"]["F32"], 0.8)
