"""Real layer shapes of the models `bench.synth_archs` builds random-weight GGUF files of.

Each `ArchShape` holds the public `config.json` values of one model, by llama.cpp's GGUF key
suffixes (`{arch}.<key>`), and `flags`: the tensor layout of its family as llama.cpp's
loader (`vendor/llama.cpp/src/models/<arch>.cpp`) and writer (`convert_hf_to_gguf.py`) have
it, read by `bench.arch_tensors`:

- `tied`: no `output.weight` (the output layer is `token_embd`);
- `qkv_bias` / `o_bias`: biases on q, k, v / on the attention output;
- `fused_qkv`: one `attn_qkv` (phi3); `ffn_fused`: one `ffn_up` of gate and up, 2 x FFN rows
  (phi3, glm4); `ffn_plain`: up and down only, with biases (starcoder2's GELU MLP);
- `qk_norm_head`: per-head q/k RMSNorm (qwen3, exaone4); `qk_norm_all`: over all heads (olmo2);
- `post_norms`: `post_attention_norm` + `post_ffw_norm` (gemma2, glm4, olmo2, exaone4);
  `no_pre_norms`: neither `attn_norm` nor `ffn_norm` (olmo2, exaone4); `no_ffn_norm`: the
  FFN reads the attention's input (cohere2's parallel block); `seed_norms`: the FFN's
  pre-norm is named `post_attention_norm` (seed_oss);
- `layernorm_bias`: LayerNorm with biases, output norm included (starcoder2);
- `rope_freqs`: Llama 3.1's one `rope_freqs` vector; `rope_factors`: phi3's long/short ones.

The labels go into `general.name`: phi3's is "Phi 3.5 mini", since llama.cpp's vocabulary
loader looks up Phi-3's special tokens (absent from the `test` vocabulary) in any model
whose name contains "phi-3".

Dense models are cut to 4 layers by default (`bench.arch_speed`'s `LAYERS` may set others);
the embedding and output layer keep the real vocabulary size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ArchShape:
    """The hyper-parameters of one real model, by llama.cpp's GGUF key suffixes."""

    arch: str
    label: str
    hidden: int
    layers: int
    vocab: int
    keys: dict[str, Any] = field(default_factory=dict)
    flags: frozenset[str] = frozenset()


def _dense(ctx: int, ff: int, heads: int, kv: int, hd: int, eps: float, base: float,
           rope: int | None = None, **extra: Any) -> dict[str, Any]:  # fmt: skip
    """The usual dense keys; `eps` is the RMSNorm epsilon (`norm_eps` in `extra` for LayerNorm)."""
    keys: dict[str, Any] = {
        "context_length": ctx, "feed_forward_length": ff, "attention.head_count": heads,
        "attention.head_count_kv": kv, "attention.key_length": hd,
        "attention.value_length": hd, "rope.freq_base": base,
        "rope.dimension_count": rope or hd,
    }  # fmt: skip
    if eps:
        keys["attention.layer_norm_rms_epsilon"] = eps
    keys.update({k.replace("__", "."): v for k, v in extra.items()})
    return keys


def _f(*names: str) -> frozenset[str]:
    return frozenset(names)


MOE_SHAPES = {
    "qwen3moe": ArchShape("qwen3moe", "Qwen3-30B-A3B", 2048, 48, 151936, {
        "context_length": 40960, "feed_forward_length": 6144,
        "attention.head_count": 32, "attention.head_count_kv": 4,
        "attention.key_length": 128, "attention.value_length": 128,
        "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6,
        "rope.dimension_count": 128, "expert_count": 128, "expert_used_count": 8,
        "expert_feed_forward_length": 768,
    }),
    "gpt-oss": ArchShape("gpt-oss", "gpt-oss-20b", 2880, 24, 201088, {
        "context_length": 131072, "feed_forward_length": 2880,
        "attention.head_count": 64, "attention.head_count_kv": 8,
        "attention.key_length": 64, "attention.value_length": 64,
        "attention.layer_norm_rms_epsilon": 1e-5, "attention.sliding_window": 128,
        "rope.freq_base": 150000.0, "rope.dimension_count": 64, "rope.scaling.type": "yarn",
        "rope.scaling.factor": 32.0, "rope.scaling.original_context_length": 4096,
        "expert_count": 32, "expert_used_count": 4, "expert_feed_forward_length": 2880,
    }),
    "deepseek2": ArchShape("deepseek2", "DeepSeek-V2-Lite", 2048, 27, 102400, {
        "context_length": 163840, "feed_forward_length": 10944,
        "leading_dense_block_count": 1, "attention.head_count": 16,
        "attention.head_count_kv": 1, "attention.key_length": 576,
        "attention.value_length": 512, "attention.key_length_mla": 192,
        "attention.value_length_mla": 128, "attention.q_lora_rank": 0,
        "attention.kv_lora_rank": 512, "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.freq_base": 10000.0, "rope.dimension_count": 64, "rope.scaling.type": "yarn",
        "rope.scaling.factor": 40.0, "rope.scaling.original_context_length": 4096,
        "rope.scaling.yarn_log_multiplier": 0.0707, "expert_count": 64,
        "expert_used_count": 6, "expert_shared_count": 2, "expert_feed_forward_length": 1408,
        "expert_weights_scale": 1.0, "expert_weights_norm": False, "expert_gating_func": 1,
    }),
}  # fmt: skip

DENSE_SHAPES = {
    "llama": ArchShape("llama", "Llama-3.1-8B", 4096, 32, 128256,
                       _dense(131072, 14336, 32, 8, 128, 1e-5, 500000.0),
                       _f("rope_freqs")),
    "qwen2": ArchShape("qwen2", "Qwen2.5-7B", 3584, 28, 152064,
                       _dense(32768, 18944, 28, 4, 128, 1e-6, 1e6), _f("qkv_bias")),
    "qwen3": ArchShape("qwen3", "Qwen3-8B", 4096, 36, 151936,
                       _dense(40960, 12288, 32, 8, 128, 1e-6, 1e6), _f("qk_norm_head")),
    "phi3": ArchShape("phi3", "Phi 3.5 mini", 3072, 32, 32064,
                      _dense(131072, 8192, 32, 32, 96, 1e-5, 10000.0,
                             rope__scaling__original_context_length=4096,
                             rope__scaling__attn_factor=1.190238),
                      _f("fused_qkv", "ffn_fused", "rope_factors")),
    "gemma2": ArchShape("gemma2", "Gemma-2-9B", 3584, 42, 256000,
                        _dense(8192, 14336, 16, 8, 256, 1e-6, 10000.0,
                               attention__sliding_window=4096,
                               attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
                        _f("tied", "post_norms")),
    "granite": ArchShape("granite", "Granite-3.1-8B", 4096, 40, 49155,
                         _dense(131072, 12800, 32, 8, 128, 1e-5, 10000000.0,
                                embedding_scale=12.0, residual_scale=0.22,
                                attention__scale=0.0078125, logit_scale=16.0),
                         _f("tied")),
    "starcoder2": ArchShape("starcoder2", "StarCoder2-7B", 4608, 32, 49152,
                            _dense(16384, 18432, 36, 4, 128, 0.0, 1000000.0,
                                   attention__layer_norm_epsilon=1e-5),
                            _f("qkv_bias", "o_bias", "ffn_plain", "layernorm_bias")),
    "cohere2": ArchShape("cohere2", "Command-R7B", 4096, 32, 256000,
                         _dense(8192, 14336, 32, 8, 128, 0.0, 50000.0,
                                attention__layer_norm_epsilon=1e-5,
                                attention__sliding_window=4096, logit_scale=0.25),
                         _f("tied", "no_ffn_norm")),
    "olmo2": ArchShape("olmo2", "OLMo-2-7B", 4096, 32, 100352,
                       _dense(4096, 11008, 32, 32, 128, 1e-6, 500000.0),
                       _f("qk_norm_all", "post_norms", "no_pre_norms")),
    "glm4": ArchShape("glm4", "GLM-4-9B-0414", 4096, 40, 151552,
                      _dense(32768, 13696, 32, 2, 128, 1e-5, 10000.0, rope=64),
                      _f("qkv_bias", "ffn_fused", "post_norms")),
    "smollm3": ArchShape("smollm3", "SmolLM3-3B", 2048, 36, 128256,
                         _dense(65536, 11008, 16, 4, 128, 1e-6, 5000000.0), _f("tied")),
    "exaone4": ArchShape("exaone4", "EXAONE-4.0-1.2B", 2048, 30, 102400,
                         _dense(65536, 4096, 32, 8, 64, 1e-5, 1000000.0),
                         _f("tied", "qk_norm_head", "post_norms", "no_pre_norms")),
    "seed_oss": ArchShape("seed_oss", "Seed-OSS-36B", 5120, 64, 155136,
                          _dense(524288, 27648, 80, 8, 128, 1e-6, 10000000.0),
                          _f("qkv_bias", "seed_norms")),
    "mistral3": ArchShape("mistral3", "Ministral-3-8B (text)", 4096, 34, 131072,
                          _dense(262144, 14336, 32, 8, 128, 1e-5, 1000000.0)),
}  # fmt: skip

SHAPES = {**MOE_SHAPES, **DENSE_SHAPES}
