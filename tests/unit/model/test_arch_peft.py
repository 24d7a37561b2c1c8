"""PEFT LoRA folders on the architectures whose projections transformers names beyond
q/k/v/o/gate/up/down (latent attention's, shared experts', fused q|k|v and gate|up, starcoder2's
c_fc/c_proj), loaded by the engine on the recorded tiny models of tests/data/archs: the answers
equal the adapter merged into the float weights (the GGUF tensors each module converts to,
q/k rows permuted as llama.cpp's converter permutes the base's where it does).

The folders are written as PEFT saves them (``base_model.model.<module>.lora_A.weight``, A [r,
in], B [out, r], ``adapter_config.json`` with r and lora_alpha); the module names are
transformers' (tests/unit/lora/test_peft_names.py checks them against llama.cpp's converter).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.model.gguf_write import write_gguf
from loraserve.model.hf import hf_to_gguf_name
from loraserve.model.weights import permute_qk
from tests.arch_models import tensor_values, typed_metadata
from tests.unit.model.archs_util import RECORDS, check_equals_merged, load, model_file

MODULES = [  # transformers' linear modules inside a layer (modeling_<arch>.py)
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "self_attn.qkv_proj", "self_attn.q_a_proj", "self_attn.q_b_proj",
    "self_attn.kv_a_proj_with_mqa", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    "mlp.gate_up_proj", "mlp.c_fc", "mlp.c_proj", "feed_forward.gate_proj",
    "feed_forward.up_proj", "feed_forward.down_proj",
    *(f"{s}.{p}_proj" for s in ("mlp.shared_experts", "mlp.shared_expert", "mlp.shared_mlp",
                                "feed_forward.shared_expert") for p in ("gate", "up", "down")),
]  # fmt: skip
# the fused or renamed modules an architecture's transformers implementation has, tried first
FIRST = {
    "phi3": ["self_attn.qkv_proj", "mlp.gate_up_proj"],
    "starcoder2": ["mlp.c_fc", "mlp.c_proj"],
}
ARCHS = ["deepseek2", "qwen2moe", "glm4moe", "hunyuan-moe", "llama4", "phi3", "starcoder2",
         "ernie4_5-moe"]  # fmt: skip
R, ALPHA, SCALE = 4, 8.0, 0.8


def peft_folder(
    path: Path, rec: dict[str, Any], arch: str, seed: int
) -> tuple[dict[str, Any], set[str]]:
    """A PEFT folder with random pairs on every module of MODULES (FIRST's first, and
    lm_head) whose GGUF tensor the model has; returns {gguf name: (A, B)} and the modules."""
    shapes = {n: s for n, s, _ in rec["tensors"]}
    n_layers = 1 + max(int(n.split(".")[1]) for n in shapes if n.startswith("blk."))
    g = torch.Generator().manual_seed(seed)
    tensors, pairs, targets, used = {}, {}, set(), set()
    mods = FIRST.get(arch, []) + MODULES
    keys = [f"model.layers.{i}.{m}" for i in range(n_layers) for m in mods] + ["lm_head"]
    for key in keys:
        name = hf_to_gguf_name(key + ".weight", arch)
        if name is None or name in pairs or name not in shapes or len(shapes[name]) != 2:
            continue  # (the first of the modules that name one tensor: e.g. c_fc, up_proj)
        out, inp = shapes[name]
        a = torch.randn(R, inp, generator=g) * 0.05
        b = torch.randn(out, R, generator=g) * 0.05
        tensors[f"base_model.model.{key}.lora_A.weight"] = a
        tensors[f"base_model.model.{key}.lora_B.weight"] = b
        pairs[name] = (a, b)
        targets.add(key.rsplit(".", 1)[-1])
        used.add(key.split(".", 3)[-1])
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    conf = {"peft_type": "LORA", "r": R, "lora_alpha": ALPHA, "target_modules": sorted(targets)}
    (path / "adapter_config.json").write_text(json.dumps(conf))
    return pairs, used


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arch_peft")


@pytest.mark.parametrize("arch", ARCHS)
def test_peft_on_every_projection_equals_merged_weights(tmp: Path, arch: str) -> None:
    variant = next(iter(RECORDS[arch]["variants"]))
    rec = RECORDS[arch]["variants"][variant]
    model = load(model_file(tmp, arch, variant, "F32"), arch)
    name_arch, cfg = RECORDS[arch]["arch"], model.config
    pairs, used = peft_folder(tmp / f"{arch}-peft", rec, name_arch, 1)
    common = {f"{s}.{p}_proj" for s, ps in (("self_attn", "qkvo"), ("mlp", ("gate", "up", "down")))
              for p in ps} | {"lm_head"}  # fmt: skip
    assert used - common, f"{arch}: no module beyond q/k/v/o/gate/up/down: {sorted(used)}"
    values = tensor_values(rec)
    for name, (a, b) in pairs.items():
        if cfg.permuted_qk and name.endswith((".attn_q.weight", ".attn_k.weight")):
            b = permute_qk(b, cfg.n_heads if ".attn_q." in name else cfg.n_kv_heads)
        delta = (ALPHA / R) * SCALE * (b.double() @ a.double())
        values[name] = values[name] + delta.float().numpy()
    merged = load(write_gguf(tmp / f"{arch}-peft-merged.gguf", typed_metadata(rec["metadata"]),
                             values), arch)  # fmt: skip
    eng = Engine(model, EngineConfig(n_slots=2, n_ctx=512, block_size=16))
    ad = eng.load_adapter(tmp / f"{arch}-peft", 0.0).result()
    assert set(ad.weights) == set(pairs)
    cases = rec["answers"]["F32"]
    check_equals_merged(eng, model, merged, cases, SCALE)
