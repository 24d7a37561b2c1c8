"""`lora.peft_targets` against PEFT itself: a PEFT LoRA on transformers' stacked expert
parameters (``target_parameters``), deepseek2's ``kv_b_proj`` and fused modules, merged by
PEFT into the transformers model, then converted as llama.cpp's converter converts those
weights (``conversion/deepseek.py``: kv_b split per head, k_b transposed; experts' gate|up split,
gpt-oss's interleaved and transposed), equals the sum of the pairs loraserve makes of the saved
folder, target by target."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from loraserve.lora.peft_targets import split_module

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             pad_token_id=None)  # fmt: skip


def peft_deltas(tmp: Path, model_type: str, extra: dict, **lora: object
                ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]],
                           dict]:  # fmt: skip
    """(PEFT's merged minus the base, per HF parameter; the saved pairs by module; config)."""
    cfg = transformers.AutoConfig.for_model(model_type, **{**SMALL, **extra})
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg).float()
    pm = peft.get_peft_model(copy.deepcopy(m), peft.LoraConfig(r=4, lora_alpha=6, **lora))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    pm.save_pretrained(tmp)
    base = dict(m.named_parameters())
    merged = dict(pm.merge_and_unload().named_parameters())
    deltas = {k: (merged[k] - base[k]).detach() for k in base if k in merged}
    sd = load_file(tmp / "adapter_model.safetensors")
    pairs = {
        k.removeprefix("base_model.model.").removesuffix(".lora_A.weight"): (
            a,
            sd[k.replace("lora_A", "lora_B")],
        )
        for k, a in sd.items()
        if ".lora_A." in k
    }
    conf = json.loads((tmp / "adapter_config.json").read_text())
    return deltas, pairs, conf


def ours(pairs: dict, conf: dict, cfg: SimpleNamespace, shapes: dict) -> dict[str, torch.Tensor]:
    """Each target's delta from loraserve's pairs: (alpha / r) B A (per expert or head)."""
    out: dict[str, torch.Tensor] = {}
    for key, (a, b) in pairs.items():
        split = split_module(key, a, b, cfg, shapes, conf.get("target_parameters") or [])
        assert split is not None, key
        for target, pa, pb in split:
            assert pa.shape[-2] == pb.shape[-1] == conf["r"], target  # the rank is kept
            out[target] = out.get(target, 0) + conf["lora_alpha"] / conf["r"] * (pb @ pa)
    return out


@pytest.mark.parametrize("fused", [False, True], ids=["split-gate-up", "fused-gate-up"])
def test_deepseek2_kv_b_and_stacked_experts(tmp_path: Path, fused: bool) -> None:
    h, nope, dv, rank, e, ff = 2, 8, 8, 16, 4, 16
    extra = dict(moe_intermediate_size=ff, intermediate_size=48, n_routed_experts=e,
                 num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                 kv_lora_rank=rank, q_lora_rank=None, qk_nope_head_dim=nope,
                 qk_rope_head_dim=8, v_head_dim=dv, num_key_value_heads=h)  # fmt: skip
    deltas, pairs, conf = peft_deltas(
        tmp_path, "deepseek_v2", extra, target_modules=["kv_b_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])  # fmt: skip
    assert "model.layers.1.mlp.experts.base_layer" in pairs  # two parameters nest
    cfg = SimpleNamespace(arch="deepseek2", n_heads=h, qk_nope_dim=nope, v_head_dim=dv,
                          n_experts=e)  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {}
    for i in (0, 1):
        shapes[f"blk.{i}.attn_k_b.weight"] = (h, rank, nope)
        shapes[f"blk.{i}.attn_v_b.weight"] = (h, dv, rank)
    shapes |= {"blk.1.ffn_gate_exps.weight": (e, ff, 32), "blk.1.ffn_up_exps.weight": (e, ff, 32),
               "blk.1.ffn_down_exps.weight": (e, 32, ff)}  # fmt: skip
    if fused:
        shapes["blk.1.ffn_gate_up_exps.weight"] = (e, 2 * ff, 32)
    got = ours(pairs, conf, cfg, shapes)
    want = {}
    for i in (0, 1):  # llama.cpp's conversion/deepseek.py
        kv_b = deltas[f"model.layers.{i}.self_attn.kv_b_proj.weight"].view(h, nope + dv, rank)
        want[f"blk.{i}.attn_k_b.weight"] = kv_b[:, :nope].transpose(1, 2)
        want[f"blk.{i}.attn_v_b.weight"] = kv_b[:, nope:]
    gate_up = deltas["model.layers.1.mlp.experts.gate_up_proj"]  # [E, 2 ff, H]
    if fused:
        want["blk.1.ffn_gate_up_exps.weight"] = gate_up
    else:
        want["blk.1.ffn_gate_exps.weight"], want["blk.1.ffn_up_exps.weight"] = gate_up.chunk(2, 1)
    want["blk.1.ffn_down_exps.weight"] = deltas["model.layers.1.mlp.experts.down_proj"]
    assert set(got) == set(want)
    for k, w in want.items():
        assert w.abs().max() > 1e-3, k
        torch.testing.assert_close(got[k], w, rtol=1e-4, atol=1e-5, msg=k)


def test_gpt_oss_interleaved_transposed_experts(tmp_path: Path) -> None:
    e, ff = 4, 16
    extra = dict(intermediate_size=ff, num_local_experts=e, num_experts_per_tok=2, head_dim=16,
                 num_key_value_heads=1)  # fmt: skip
    deltas, pairs, conf = peft_deltas(
        tmp_path, "gpt_oss", extra,
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])  # fmt: skip
    cfg = SimpleNamespace(arch="gpt-oss", n_experts=e)
    shapes = {f"blk.{i}.ffn_{s}_exps.weight": (e, ff, 32) for i in (0, 1) for s in ("gate", "up")}
    shapes |= {f"blk.{i}.ffn_down_exps.weight": (e, 32, ff) for i in (0, 1)}
    got = ours(pairs, conf, cfg, shapes)
    for i in (0, 1):  # [E, in, out] in transformers; llama.cpp de-interleaves gate and up
        gate_up = deltas[f"model.layers.{i}.mlp.experts.gate_up_proj"].transpose(1, 2)
        for name, w in (
            ("gate", gate_up[:, 0::2]),
            ("up", gate_up[:, 1::2]),
            ("down", deltas[f"model.layers.{i}.mlp.experts.down_proj"].transpose(1, 2)),
        ):
            torch.testing.assert_close(got[f"blk.{i}.ffn_{name}_exps.weight"], w, rtol=1e-4,
                                       atol=1e-5)  # fmt: skip


def test_fused_modules_on_split_bases(tmp_path: Path) -> None:
    """phi3's qkv_proj where the base stores attn_q/k/v, granitemoeshared's input_linear."""
    phi3 = dict(intermediate_size=48, num_key_value_heads=1)
    deltas, pairs, conf = peft_deltas(tmp_path / "phi3", "phi3", phi3, target_modules=["qkv_proj"])
    cfg = SimpleNamespace(arch="phi3", n_heads=2, n_kv_heads=1, head_dim=16)
    shapes = {f"blk.{i}.attn_{s}.weight": (32 if s == "q" else 16, 32)
              for i in (0, 1) for s in "qkv"}  # fmt: skip
    got = ours(pairs, conf, cfg, shapes)
    for i in (0, 1):
        q, k, v = deltas[f"model.layers.{i}.self_attn.qkv_proj.weight"].split([32, 16, 16])
        for s, w in (("q", q), ("k", k), ("v", v)):
            torch.testing.assert_close(got[f"blk.{i}.attn_{s}.weight"], w, rtol=1e-4, atol=1e-5)
    deltas, pairs, conf = peft_deltas(
        tmp_path / "granite", "granitemoeshared",
        dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
             shared_intermediate_size=24, num_key_value_heads=1),
        target_modules=["input_linear"])  # fmt: skip
    cfg = SimpleNamespace(arch="granitemoe", n_experts=4)
    shapes = {f"blk.{i}.ffn_{s}_shexp.weight": (24, 32) for i in (0, 1) for s in ("gate", "up")}
    got = ours(pairs, conf, cfg, shapes)
    for i in (0, 1):
        gate, up = deltas[f"model.layers.{i}.shared_mlp.input_linear.weight"].chunk(2, 0)
        torch.testing.assert_close(got[f"blk.{i}.ffn_gate_shexp.weight"], gate, rtol=1e-4,
                                   atol=1e-5)  # fmt: skip
        torch.testing.assert_close(got[f"blk.{i}.ffn_up_shexp.weight"], up, rtol=1e-4, atol=1e-5)
