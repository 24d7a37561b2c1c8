"""PEFT adapters address an architecture's projections by transformers' module names; loraserve
maps them to the GGUF tensors they adapt (`model.hf.hf_to_gguf_name`) under the names
llama.cpp's converter gives those tensors (gguf-py's ``TensorNameMap``, also what
``convert_lora_to_gguf.py`` uses), for every linear module of each transformers
implementation: latent attention's, shared experts', fused ones, and the routers that are
linear modules. The routed experts' stacked parameters have no module of their own
(`lora.peft_targets`)."""

from __future__ import annotations

import gguf
import pytest
import torch
from torch import nn

from loraserve.model.hf import hf_to_gguf_name

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, pad_token_id=None)  # fmt: skip
# transformers model_type -> (its config beyond SMALL, gguf's arch, loraserve's arch name)
CASES = {
    "deepseek_v2": (dict(moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                         n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16,
                         q_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                         num_key_value_heads=2), "DEEPSEEK2", "deepseek2"),
    "deepseek_v2-lite": (dict(moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                              n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16,
                              q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8,
                              v_head_dim=8, num_key_value_heads=2), "DEEPSEEK2", "deepseek2"),
    "qwen2_moe": (dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                       shared_expert_intermediate_size=24), "QWEN2MOE", "qwen2moe"),
    "qwen3_moe": (dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                       head_dim=16), "QWEN3MOE", "qwen3moe"),
    "glm4_moe": (dict(moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                      n_shared_experts=1, first_k_dense_replace=1, head_dim=16), "GLM4_MOE",
                 "glm4moe"),
    "ernie4_5_moe": (dict(moe_intermediate_size=16, moe_num_experts=4, moe_k=2,
                          moe_num_shared_experts=1, moe_layer_start_index=0), "ERNIE4_5_MOE",
                     "ernie4_5-moe"),
    "hunyuan_v1_moe": (dict(moe_intermediate_size=16, num_experts=4, moe_topk=2,
                            num_shared_expert=1, head_dim=16), "HUNYUAN_MOE", "hunyuan-moe"),
    "llama4_text": (dict(intermediate_size_mlp=48, num_local_experts=4, num_experts_per_tok=1,
                         head_dim=16), "LLAMA4", "llama4"),
    "granitemoeshared": (dict(num_local_experts=4, num_experts_per_tok=2,
                              shared_intermediate_size=24), "GRANITE_MOE", "granitemoe"),
    "gpt_oss": (dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16), "GPT_OSS",
                "gpt-oss"),
    "phi3": ({}, "PHI3", "phi3"),
    "glm4": ({}, "GLM4", "glm4"),
    "starcoder2": ({}, "STARCODER2", "starcoder2"),
    "olmoe": (dict(num_experts=4, num_experts_per_tok=2), "OLMOE", "olmoe"),
    "minimax_m2": (dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16), "MINIMAXM2",
                   "minimax-m2"),
    **{t: ({}, a, n) for t, a, n in (
        ("gemma2", "GEMMA2", "gemma2"), ("cohere2", "COHERE2", "cohere2"),
        ("exaone4", "EXAONE4", "exaone4"), ("olmo2", "OLMO2", "olmo2"),
        ("smollm3", "SMOLLM3", "smollm3"), ("seed_oss", "SEED_OSS", "seed_oss"),
        ("granite", "GRANITE", "granite"), ("qwen3", "QWEN3", "qwen3"))},
}  # fmt: skip


def linear_modules(model_type: str, extra: dict) -> list[str]:
    """The names of a tiny transformers model's linear modules inside its layers."""
    cfg = transformers.AutoConfig.for_model(model_type.split("-")[0], **{**SMALL, **extra})
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg)
    return [n for n, mod in m.named_modules()
            if isinstance(mod, nn.Linear) and ".layers." in n]  # fmt: skip


@pytest.mark.parametrize("model_type", list(CASES))
def test_module_names_map_as_llama_cpp_converts_them(model_type: str) -> None:
    extra, gguf_arch, arch = CASES[model_type]
    if not hasattr(gguf.MODEL_ARCH, gguf_arch):
        pytest.skip(f"gguf-py here has no {gguf_arch}")
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, gguf_arch), 2)
    modules = linear_modules(model_type, extra)
    assert modules, "no linear modules found"
    checked = 0
    for module in modules:
        want = names.get_name(module)
        if want is None:  # a module llama.cpp's converter splits or renames by hand
            continue
        assert hf_to_gguf_name(module + ".weight", arch) == want + ".weight", module
        checked += 1
    assert checked >= len(modules) - 2, f"only {checked} of {modules} have a GGUF name"
