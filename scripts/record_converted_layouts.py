"""Record the layouts llama.cpp's own converter writes (test data), and check them against
transformers float32.

For each architecture: a tiny random Hugging Face checkpoint (transformers, 2-3 layers, small
sizes, the family's flags), converted by the vendored ``convert_hf_to_gguf.py --outtype f32``
(its vocabulary step replaced by the 128-token ``test`` vocabulary of tests/data/archs: we
record the model's keys and tensors, not a tokenizer), loaded by loraserve and run on a few
token ids beside transformers' float32 forward pass on the same checkpoint. Writes
tests/data/converted/<arch>.json: the converted file's metadata (typed, tokenizer keys left
out) and tensor table (name, torch-order shape, ggml type), no weights, plus what this run saw
(converts / loads / relative logit difference).

Usage: python scripts/record_converted_layouts.py [ARCH ...]   (default: every arch below)
Needs the vendored llama.cpp (LLAMA_CPP below) and transformers; runs the converter in a
subprocess with its own gguf-py first on sys.path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP", Path.home() / ".cache/loraserve/peer/"
                                "llama_cpp_python-0.3.36/vendor/llama.cpp"))  # fmt: skip
OUT = ROOT / "tests" / "data" / "converted"
IDS = [5, 9, 77, 3, 12, 40, 100, 7, 64, 1]
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256, tie_word_embeddings=False)  # fmt: skip
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
MAMBA = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1,
             mamba_expand=2, mamba_d_conv=4)  # fmt: skip
# arch -> (transformers class, config changes from BASE)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", {}),
    "mistral": ("MistralForCausalLM", {}),
    "mixtral": ("MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "phi3": ("Phi3ForCausalLM", dict(pad_token_id=0)),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3ForCausalLM", {}),
    "qwen3moe": ("Qwen3MoeForCausalLM", dict(MOE, norm_topk_prob=True)),
    "gemma2": ("Gemma2ForCausalLM", dict(query_pre_attn_scalar=16, sliding_window=4,
                                         tie_word_embeddings=True)),
    "gemma3": ("Gemma3ForCausalLM", dict(query_pre_attn_scalar=16, sliding_window=4,
                                         tie_word_embeddings=True)),
    "mistral3": ("Ministral3ForCausalLM", {}),
    "granite": ("GraniteForCausalLM", dict(embedding_multiplier=12.0, residual_multiplier=0.2,
                                           attention_multiplier=0.05, logits_scaling=8.0)),
    "granitemoe": ("GraniteMoeForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2,
                                                 embedding_multiplier=12.0, logits_scaling=8.0)),
    "granitehybrid": ("GraniteMoeHybridForCausalLM", dict(
        MAMBA, layer_types=["mamba", "attention"], num_local_experts=0,
        shared_intermediate_size=96, embedding_multiplier=12.0, logits_scaling=8.0)),
    "qwen35": ("Qwen3_5ForCausalLM", dict(
        layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)),
    "qwen35moe": ("Qwen3_5MoeForCausalLM", dict(
        MOE, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        shared_expert_intermediate_size=32)),
    "qwen3next": ("Qwen3NextForCausalLM", dict(
        MOE, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        shared_expert_intermediate_size=32)),
    "lfm2": ("Lfm2ForCausalLM", dict(layer_types=["conv", "full_attention"],
                                     block_auto_adjust_ff_dim=False, block_ff_dim=96)),
    "nemotron_h": ("NemotronHForCausalLM", dict(
        num_hidden_layers=3, hybrid_override_pattern="M*-", layers_block_type=None,
        mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=1, expand=2,
        conv_kernel=4)),
    "nemotron_h_moe": ("NemotronHForCausalLM", dict(
        num_hidden_layers=3, hybrid_override_pattern="M*E", mamba_num_heads=8,
        mamba_head_dim=16, ssm_state_size=16, n_groups=1, expand=2, conv_kernel=4,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32, n_group=1, topk_group=1)),
    "lfm2moe": ("Lfm2MoeForCausalLM", dict(layer_types=["conv", "full_attention"],
                                           num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=32, num_dense_layers=1,
                                           tie_word_embeddings=True)),
    "falcon-h1": ("FalconH1ForCausalLM", dict(MAMBA, mamba_d_ssm=128, mamba_chunk_size=4)),
    "deepseek2": ("DeepseekV2ForCausalLM", dict(
        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        n_shared_experts=1, first_k_dense_replace=1, topk_method="greedy", n_group=1,
        topk_group=1, num_key_value_heads=4, head_dim=24)),
    "gpt-oss": ("GptOssForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2,
                                          sliding_window=4)),
    "olmo2": ("Olmo2ForCausalLM", {}),
    "smollm3": ("SmolLM3ForCausalLM", dict(pad_token_id=0)),
    "glm4": ("Glm4ForCausalLM", dict(pad_token_id=0)),
    # llama.cpp takes Command R7B's 3 sliding : 1 global (the converter writes no pattern)
    "cohere2": ("Cohere2ForCausalLM", dict(sliding_window=4, sliding_window_pattern=4,
                                           num_hidden_layers=4, tie_word_embeddings=True)),
    "starcoder2": ("Starcoder2ForCausalLM", {}),
    # llama.cpp slides windows only in the 64-layer (32B) EXAONE 4, transformers wherever
    # sliding_window is set: a window past the ids keeps the two alike
    "exaone4": ("Exaone4ForCausalLM", dict(sliding_window=128)),
    # OLMoE: as many KV heads as heads (llama.cpp's k norm is hidden wide)
    "olmoe": ("OlmoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2,
                                       num_key_value_heads=4)),
    "qwen2moe": ("Qwen2MoeForCausalLM", dict(MOE, shared_expert_intermediate_size=48)),
    "ernie4_5-moe": ("Ernie4_5_MoeForCausalLM", dict(
        moe_num_experts=4, moe_k=2, moe_intermediate_size=48, moe_layer_start_index=1,
        moe_num_shared_experts=1)),
    "hunyuan-moe": ("HunYuanMoEV1ForCausalLM", dict(num_experts=4, moe_topk=2)),
    "minimax-m2": ("MiniMaxM2ForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2,
                                                rotary_dim=8)),
    "glm4moe": ("Glm4MoeForCausalLM", dict(
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        first_k_dense_replace=1, n_shared_experts=1, n_group=1, topk_group=1,
        use_qk_norm=True)),
    # 4 layers: the 4th without rope (llama-server aborts on a llama4 without one)
    "llama4": ("Llama4ForCausalLM", dict(num_hidden_layers=4, num_local_experts=4,
                                         num_experts_per_tok=1,
                                         intermediate_size=32, intermediate_size_mlp=96,
                                         interleave_moe_layer_step=1)),
    "seed_oss": ("SeedOssForCausalLM", {}),
    "jamba": ("JambaForCausalLM", dict(
        num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
        attn_layer_period=2, attn_layer_offset=1, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_dt_rank=8, use_mamba_kernels=False)),
    "mamba2": ("Mamba2ForCausalLM", dict(intermediate_size=None, num_heads=8, head_dim=16,
                                         expand=2, state_size=16, n_groups=1, chunk_size=4)),
}  # fmt: skip

# per-layer counts without a nonzero entry: no FFN layer, no attention layer (llama.cpp loads them)
CASES["nemotron_h+no_ffn"] = (
    CASES["nemotron_h"][0],
    dict(CASES["nemotron_h"][1], num_hidden_layers=2, hybrid_override_pattern="M*"),
)
CASES["granitehybrid+no_attention"] = (
    CASES["granitehybrid"][0],
    dict(CASES["granitehybrid"][1], layer_types=["mamba", "mamba"]),
)

# Qwen3.5 / Qwen3-Next as on the Hub: one multi-token-prediction layer, converted by default
for _a in ("qwen35", "qwen35moe", "qwen3next"):
    CASES[_a + "+mtp"] = CASES[_a]

# config.json as the Hub's checkpoints spell it where transformers 5 saves another spelling
# the converter reads differently (None: the key removed)
HUB_CONFIG: dict[str, dict[str, Any]] = {
    # Granite 4.0-H micro: no experts, num_experts_per_tok 0 (transformers' default 2: llama.cpp
    # asserts expert_used_count <= expert_count)
    "granitehybrid": {"layer_types": ["mamba", "attention"], "num_experts_per_tok": 0},
    "nemotron_h": {"hybrid_override_pattern": "M*-", "layers_block_type": None,
                   "mtp_layers_block_type": None, "num_experts_per_tok": None,
                   "n_routed_experts": None, "num_hidden_layers": 3,
                   "n_group": None, "topk_group": None},  # llama.cpp: no expert groups
    "cohere2": {"rotary_pct": 1.0},
    "minimax-m2": {"scoring_func": "sigmoid"},  # MiniMax-M2's; transformers 5 saves none
    # Hunyuan-A13B's config: per-layer lists (transformers' experts are intermediate_size wide)
    "hunyuan-moe": {"moe_topk": [2, 2], "moe_intermediate_size": [96, 96],
                    "num_shared_expert": [1, 1]},
}  # fmt: skip
# Read config.json as it is, not through transformers' AutoConfig (which adds a class's
# defaults): transformers 5 gives NemotronHConfig MoE defaults (num_experts_per_tok), so the
# converter writes a dense Nemotron-H as nemotron_h_moe with no FFN sizes, which llama.cpp
# refuses too; Nemotron-Nano-9B-v2 was converted from its own (remote-code) config.json.
RAW_CONFIG = {"nemotron_h", "nemotron_h+no_ffn"}
HUB_CONFIG["nemotron_h+no_ffn"] = dict(HUB_CONFIG["nemotron_h"], num_hidden_layers=2,
                                       hybrid_override_pattern="M*")  # fmt: skip
HUB_CONFIG["granitehybrid+no_attention"] = {"layer_types": ["mamba", "mamba"],
                                            "num_experts_per_tok": 0}  # fmt: skip
for _a in ("qwen35", "qwen35moe", "qwen35+mtp", "qwen35moe+mtp"):  # 2 rope pairs of 16 dims
    HUB_CONFIG[_a] = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                      "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                      "mrope_interleaved": True}}  # fmt: skip
# converter flags: the random checkpoints carry no multi-token-prediction layers
CONVERT_ARGS: dict[str, list[str]] = {a: ["--no-mtp"] for a in ("qwen35", "qwen35moe",
                                                                 "qwen3next")}  # fmt: skip

# The converter run in a subprocess: every model class's vocabulary step writes the template
# vocabulary's keys (argv[1]: a JSON file of [key, type, value]), then convert_hf_to_gguf's main.
_WRAPPER = r"""
import importlib, json, pkgutil, sys
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/gguf-py"]
entries = json.load(open(sys.argv[1]))
import conversion
from conversion.base import ModelBase, TextModel
if sys.argv[3] == "raw":
    ModelBase.load_hparams = staticmethod(lambda d, *a, **k: json.load(open(d / "config.json")))
for m in pkgutil.iter_modules(conversion.__path__):
    try:
        importlib.import_module("conversion." + m.name)
    except Exception:
        pass
def set_vocab(self):
    w = self.gguf_writer
    for key, vtype, value in entries:
        if vtype in ("STRING",):
            w.add_string(key, value)
        elif vtype == "BOOL":
            w.add_bool(key, value)
        elif vtype == "UINT32":
            w.add_uint32(key, value)
        elif vtype == "INT32":
            w.add_int32(key, value)
        else:
            w.add_array(key, value)
todo = [TextModel]
while todo:
    c = todo.pop()
    todo += c.__subclasses__()
    if "set_vocab" in c.__dict__ or c is TextModel:
        c.set_vocab = set_vocab
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[4:]
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def vocab_entries() -> list[list[Any]]:
    """The template vocabulary's keys (tests/data/archs/llama.json's dense variant)."""
    rec = json.loads((ROOT / "tests/data/archs/llama.json").read_text())
    return [m for m in rec["variants"]["dense"]["metadata"] if m[0].startswith("tokenizer.")]


def checkpoint(arch: str, folder: Path) -> Any:
    """A tiny random transformers model of the arch, saved in ``folder`` (float32), returned.
    Norm weights and biases get noise so that they matter (their inits are ones / zeros)."""
    import transformers

    cls_name, changes = CASES[arch]
    cls = getattr(transformers, cls_name)
    kw = dict(BASE, **changes)
    kw = {k: v for k, v in kw.items() if v is not None}
    cfg = cls.config_class(**kw)
    torch.manual_seed(0)
    model = cls(cfg).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    cfg_path = folder / "config.json"
    saved = json.loads(cfg_path.read_text())
    for k, v in HUB_CONFIG.get(arch, {}).items():
        saved.pop(k, None) if v is None else saved.__setitem__(k, v)
    if arch.endswith("+mtp"):  # transformers keeps no MTP weights: a copy of layer 1, noised
        _add_mtp(model, folder, saved)
    cfg_path.write_text(json.dumps(saved))
    vocab = {f"t{i}": i for i in range(BASE["vocab_size"])}  # gemma3 trims its embeddings to it
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab},
                                                       "added_tokens": []}))  # fmt: skip
    return model


def _add_mtp(model: Any, folder: Path, config: dict[str, Any]) -> None:
    """The Hub's ``mtp.*`` tensors (one layer: the full-attention layer 1's, noised, and the
    fc / norms) in a second safetensors file, and ``mtp_num_hidden_layers`` 1."""
    from safetensors.torch import save_file

    g, h = torch.Generator().manual_seed(2), int(config.get("hidden_size", BASE["hidden_size"]))
    pre = "model.layers.1."
    mtp = {"mtp.layers.0." + k[len(pre):]: v + 0.01 * torch.randn(v.shape, generator=g)
           for k, v in model.state_dict().items() if k.startswith(pre)}  # fmt: skip
    mtp["mtp.fc.weight"] = torch.randn(h, 2 * h, generator=g) * 0.02
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{n}.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    save_file({k: v.contiguous() for k, v in mtp.items()}, str(folder / "model-mtp.safetensors"))
    config["mtp_num_hidden_layers"] = 1


def convert(folder: Path, out: Path, args: list[str], raw: bool = False) -> str:
    """Runs the vendored converter on ``folder``; '' on success, else its last error lines."""
    vocab = folder / "vocab_entries.json"
    vocab.write_text(json.dumps(vocab_entries()))
    cmd = [sys.executable, "-c", _WRAPPER, str(vocab), str(LLAMA_CPP), "raw" if raw else "auto",
           str(folder), "--outtype", "f32", "--outfile", str(out), *args]  # fmt: skip
    env = dict(os.environ, NO_LOCAL_GGUF="1")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=LLAMA_CPP, env=env)
    return "" if r.returncode == 0 else "\n".join(r.stderr.strip().splitlines()[-3:])


def layout(path: Path) -> dict[str, Any]:
    """The file's typed metadata (tokenizer keys left out) and tensor table, as the template
    records spell them: [key, type, value], [name, torch-order shape, ggml type]."""
    sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))
    from gguf import GGUFReader, GGUFValueType

    r = GGUFReader(path)
    meta = []
    for f in r.fields.values():
        if f.name.startswith(("tokenizer.", "GGUF.")):
            continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            vtype = "ARRAY:" + f.types[-1].name
        else:
            vtype = t.name
        v = f.contents()
        meta.append([f.name, vtype, v])
    tensors = [[t.name, [int(x) for x in reversed(t.shape.tolist())], int(t.tensor_type)]
               for t in r.tensors]  # fmt: skip
    return {"metadata": meta, "tensors": tensors}


def ours(path: Path, ids: list[int]) -> torch.Tensor:
    """loraserve's float32 logits [len(ids), V] at every position."""
    from loraserve.engine.runner import BatchItem, ModelRunner
    from loraserve.model.loader import load_model

    runner = ModelRunner(load_model(path).decoder, 4, torch.float32)
    n = -(-len(ids) // 4)
    runner.ensure_capacity(n)
    return runner.forward([BatchItem(ids, 0, len(ids), list(range(n)), True, {},
                                     n_logits=len(ids))])  # fmt: skip


def _plain(o: Any) -> Any:
    return o.item() if hasattr(o, "item") else o.tolist() if hasattr(o, "tolist") else str(o)


def record(arch: str) -> dict[str, Any]:
    """One arch: checkpoint, convert, layout, load, logits; the record written to OUT."""
    res: dict[str, Any] = {"arch": arch, "hf_class": CASES[arch][0]}
    with tempfile.TemporaryDirectory() as tmp:
        folder, out = Path(tmp) / "hf", Path(tmp) / "model.gguf"
        model = checkpoint(arch, folder)
        err = convert(folder, out, CONVERT_ARGS.get(arch, []), arch in RAW_CONFIG)
        res["converts"] = not err
        if err:
            res["convert_error"] = err
            return res
        res.update(layout(out))
        res["gguf_arch"] = next(m[2] for m in res["metadata"] if m[0] == "general.architecture")
        with torch.no_grad():
            want = model(torch.tensor([IDS]), use_cache=False).logits[0].float()
        try:
            got = ours(out, IDS)
            res["loads"] = True
            res["rel_diff"] = float((got - want).abs().max() / want.abs().max())
        except Exception as e:  # noqa: BLE001
            res["loads"] = False
            res["load_error"] = f"{type(e).__name__}: {e}"[:500]
            traceback.print_exc()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{arch}.json").write_text(json.dumps(res, default=_plain) + "\n")
    return res


def main() -> None:
    for arch in sys.argv[1:] or list(CASES):
        try:
            res = record(arch)
        except Exception as e:  # noqa: BLE001
            res = {"arch": arch, "error": f"{type(e).__name__}: {e}"[:300]}
        show = {k: v for k, v in res.items() if k not in ("metadata", "tensors")}
        print(json.dumps(show), flush=True)


if __name__ == "__main__":
    main()
