"""PEFT folders whose modules adapt several GGUF tensors or a stacked parameter, through the
engine on the recorded tiny deepseek2 with 3 heads (test_mla_adapters' spec): ``kv_b_proj``
(attn_k_b / attn_v_b per head) and the routed experts' ``mlp.experts.gate_up_proj`` /
``down_proj`` as PEFT's ``target_parameters`` saves them (nested ``experts.base_layer.lora_A``,
A [E r, in], B [out, E r]). The answers equal the module deltas merged into the float weights as
llama.cpp's converter lays them out (`lora.peft_targets`; test_peft_targets checks the pairs
against PEFT's own merge)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.model.gguf_write import write_gguf
from loraserve.model.loader import load_model
from tests.arch_models import tensor_values, typed_metadata, write_model
from tests.unit.model.archs_util import check_equals_merged
from tests.unit.model.mla_util import HEADS, mla_spec

R, ALPHA, SCALE = 4, 8.0, 0.8


def _folder(path: Path, spec: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """The PEFT folder, and each GGUF tensor's delta (alpha / r) B A in the file's layout."""
    shapes = {n: s for n, s, _ in spec["tensors"]}
    _, rank, nope = shapes["blk.0.attn_k_b.weight"]  # [H, rank, nope]
    dv = shapes["blk.0.attn_v_b.weight"][1]  # [H, v, rank]
    tensors, deltas = {}, {}
    f = ALPHA / R

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g) * 0.05

    for i in range(2):
        a, b = rnd(R, rank), rnd(HEADS * (nope + dv), R)  # kv_b_proj [H (nope + v), rank]
        key = f"base_model.model.model.layers.{i}.self_attn.kv_b_proj"
        tensors[key + ".lora_A.weight"], tensors[key + ".lora_B.weight"] = a, b
        kv_b = (f * b @ a).view(HEADS, nope + dv, rank)  # conversion/deepseek.py's split
        deltas[f"blk.{i}.attn_k_b.weight"] = kv_b[:, :nope].transpose(1, 2)
        deltas[f"blk.{i}.attn_v_b.weight"] = kv_b[:, nope:]
        if f"blk.{i}.ffn_gate_up_exps.weight" not in shapes:
            continue
        e, two_ff, hid = shapes[f"blk.{i}.ffn_gate_up_exps.weight"]
        ff = two_ff // 2
        key = f"base_model.model.model.layers.{i}.mlp.experts"
        for nest, (param, out, inp) in (("base_layer.", ("gate_up", two_ff, hid)),
                                        ("", ("down", hid, ff))):  # fmt: skip
            a, b = rnd(e * R, inp), rnd(out, e * R)  # PEFT's ParamWrapper layout
            tensors[f"{key}.{nest}lora_A.weight"] = a
            tensors[f"{key}.{nest}lora_B.weight"] = b
            a3 = a.view(e, R, inp)
            b3 = b.view(out, R, e).permute(2, 0, 1)
            deltas[f"blk.{i}.ffn_{param}_exps.weight"] = f * b3 @ a3  # [E, out, in]
    path.mkdir()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    conf = {
        "peft_type": "LORA",
        "r": R,
        "lora_alpha": ALPHA,
        "target_modules": ["kv_b_proj"],
        "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    }
    (path / "adapter_config.json").write_text(json.dumps(conf))
    return deltas


def test_kv_b_and_expert_parameters_equal_merged_weights(tmp_path: Path) -> None:
    spec = mla_spec()
    model = load_model(write_model(spec, tmp_path / "ds2.gguf"))
    deltas = _folder(tmp_path / "peft", spec, torch.Generator().manual_seed(3))
    assert "blk.1.ffn_gate_up_exps.weight" in deltas
    values = tensor_values(spec)
    for name, d in deltas.items():
        values[name] = values[name] + SCALE * d.float().numpy()
    merged = load_model(write_gguf(tmp_path / "merged.gguf", typed_metadata(spec["metadata"]),
                                   values))  # fmt: skip
    eng = Engine(model, EngineConfig(n_slots=2, n_ctx=512, block_size=16))
    ad = eng.load_adapter(tmp_path / "peft", 0.0).result()
    assert {"blk.0.attn_k_b.weight", "blk.1.ffn_gate_up_exps.weight"} <= set(ad.weights)
    cases = spec["answers"]["F32"]
    check_equals_merged(eng, model, merged, cases, SCALE)
