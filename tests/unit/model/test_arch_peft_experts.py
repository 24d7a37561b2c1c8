"""PEFT folders from transformers 4's MoE layout, one module per expert
(``mlp.experts.N.gate_proj`` / ``up_proj`` / ``down_proj``), through the engine on the recorded
tiny deepseek2 (test_mla_adapters' spec, whose base joins gate and up in ``ffn_gate_up_exps``):
the answers equal each expert's delta (alpha / r) B A merged into the float weights, an expert
the adapter leaves out keeps its weights, and a stack that cannot be one pair is refused naming
the layer (`lora.peft_experts`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.lora.adapter_checks import AdapterError
from loraserve.model.gguf_write import write_gguf
from loraserve.model.loader import load_model
from tests.arch_models import tensor_values, typed_metadata, write_model
from tests.unit.model.archs_util import check_equals_merged
from tests.unit.model.mla_util import mla_spec

R, ALPHA, SCALE = 4, 8.0, 0.8


def _folder(path: Path, spec: dict, g: torch.Generator, skip: int = 1,
            conf: dict | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """The per-expert PEFT folder (expert `skip` left out) and each GGUF tensor's delta."""
    shapes = {n: s for n, s, _ in spec["tensors"]}
    tensors, deltas, f = {}, {}, ALPHA / R
    layers = [i for i in range(4) if f"blk.{i}.ffn_gate_up_exps.weight" in shapes]
    assert layers, "the spec has no routed experts"
    for i in layers:
        e, two_ff, hid = shapes[f"blk.{i}.ffn_gate_up_exps.weight"]
        ff = two_ff // 2
        gate_up = torch.zeros(e, two_ff, hid)
        down = torch.zeros(e, hid, ff)
        for x in range(e):
            if x == skip:
                continue
            for proj, out, inp in (("gate_proj", ff, hid), ("up_proj", ff, hid),
                                   ("down_proj", hid, ff)):  # fmt: skip
                a = torch.randn(R, inp, generator=g) * 0.05
                b = torch.randn(out, R, generator=g) * 0.05
                key = f"base_model.model.model.layers.{i}.mlp.experts.{x}.{proj}"
                tensors[key + ".lora_A.weight"], tensors[key + ".lora_B.weight"] = a, b
                d = f * b @ a
                if proj == "down_proj":
                    down[x] = d
                else:
                    gate_up[x, (0 if proj == "gate_proj" else ff) :][:ff] = d
        deltas[f"blk.{i}.ffn_gate_up_exps.weight"] = gate_up
        deltas[f"blk.{i}.ffn_down_exps.weight"] = down
    path.mkdir()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    base = {"peft_type": "LORA", "r": R, "lora_alpha": ALPHA,
            "target_modules": ["gate_proj", "up_proj", "down_proj"]}  # fmt: skip
    (path / "adapter_config.json").write_text(json.dumps(base | (conf or {})))
    return deltas


def test_per_expert_modules_equal_merged_weights(tmp_path: Path) -> None:
    spec = mla_spec()
    model = load_model(write_model(spec, tmp_path / "ds2.gguf"))
    deltas = _folder(tmp_path / "peft", spec, torch.Generator().manual_seed(5))
    values = tensor_values(spec)
    for name, d in deltas.items():
        values[name] = values[name] + SCALE * d.numpy()
    merged = load_model(write_gguf(tmp_path / "merged.gguf", typed_metadata(spec["metadata"]),
                                   values))  # fmt: skip
    eng = Engine(model, EngineConfig(n_slots=2, n_ctx=512, block_size=16))
    ad = eng.load_adapter(tmp_path / "peft", 0.0).result()
    stacked = [n for n in ad.weights if "_exps" in n]
    assert stacked and all(n.endswith(("ffn_gate_up_exps.weight", "ffn_down_exps.weight"))
                           for n in stacked)  # fmt: skip
    cases = spec["answers"]["F32"]
    check_equals_merged(eng, model, merged, cases, SCALE)


def test_experts_of_different_scale_are_refused(tmp_path: Path) -> None:
    spec = mla_spec()
    model = load_model(write_model(spec, tmp_path / "ds2.gguf"))
    conf = {"alpha_pattern": {"experts.0.gate_proj": 2.0}}
    _folder(tmp_path / "peft", spec, torch.Generator().manual_seed(6), conf=conf)
    eng = Engine(model, EngineConfig(n_slots=1, n_ctx=256, block_size=16))
    with pytest.raises(
        AdapterError, match=r"layer \d+'s experts.*(different scale factors|scale factors differ)"
    ):
        eng.load_adapter(tmp_path / "peft", 0.0).result()
