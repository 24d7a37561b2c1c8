"""`ModelConfig`: the one frozen description of a decoder, derived from GGUF or HF metadata.

Architectures differ only by fields here (norm placement, activation, biases, rope bases,
sliding windows, experts); the decoder in `decoder.py` reads these flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHS = ("llama", "gemma3", "qwen2", "qwen3")


class UnsupportedModelError(ValueError):
    """The model file describes something loraserve cannot run."""


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters and architecture flags of a decoder-only transformer."""

    arch: str
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    rms_eps: float
    rope_theta: float
    context_length: int
    # rope base of sliding-window layers (gemma3: 10,000); equals rope_theta elsewhere
    rope_theta_local: float = 0.0
    sliding_window: int = 0  # 0 = no sliding-window layers
    sliding_layers: tuple[bool, ...] = field(default=())  # per layer: uses the window
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before rope
    qkv_bias: bool = False
    post_norms: bool = False  # gemma: post_attention_norm and post_ffw_norm
    act: str = "silu"  # "silu" or "gelu_tanh" (gated in both cases)
    embed_scale: float = 1.0  # gemma: sqrt(hidden_size)
    attn_scale: float = 0.0  # softmax scale; 0 -> 1/sqrt(head_dim)
    tied_output: bool = False
    n_experts: int = 0  # 0 = dense FFN
    n_experts_used: int = 0

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"unsupported architecture {self.arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        if not self.sliding_layers:
            object.__setattr__(self, "sliding_layers", (False,) * self.n_layers)
        if self.rope_theta_local == 0.0:
            object.__setattr__(self, "rope_theta_local", self.rope_theta)
        if self.attn_scale == 0.0:
            object.__setattr__(self, "attn_scale", 1.0 / math.sqrt(self.head_dim))
        if len(self.sliding_layers) != self.n_layers:
            raise UnsupportedModelError("sliding_layers must have one entry per layer")
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedModelError("n_heads must be a multiple of n_kv_heads")

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @staticmethod
    def from_gguf(meta: dict[str, Any], tensor_names: set[str] | None = None) -> ModelConfig:
        """Derive the config from GGUF metadata (keys like ``llama.block_count``)."""
        arch = str(meta.get("general.architecture", ""))
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        tensor_names = tensor_names or set()

        def get(key: str, default: Any = None) -> Any:
            v = meta.get(f"{arch}.{key}", default)
            if v is None:
                raise UnsupportedModelError(f"GGUF metadata lacks {arch}.{key}")
            return v

        hidden = int(get("embedding_length"))
        n_heads = int(get("attention.head_count"))
        n_kv = get("attention.head_count_kv", n_heads)
        if isinstance(n_kv, list):
            raise UnsupportedModelError("per-layer head_count_kv is not supported")
        head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // n_heads))
        n_layers = int(get("block_count"))
        vocab = len(meta["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in meta else None
        vocab = int(meta.get(f"{arch}.vocab_size", vocab or 0))
        common: dict[str, Any] = dict(
            arch=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(n_kv),
            head_dim=head_dim,
            ffn_dim=int(get("feed_forward_length")),
            rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            context_length=int(get("context_length", 2048)),
            tied_output=bool(tensor_names) and "output.weight" not in tensor_names,
        )
        if arch == "llama":
            common["n_experts"] = int(meta.get("llama.expert_count", 0))
            common["n_experts_used"] = int(meta.get("llama.expert_used_count", 0))
        elif arch == "gemma3":
            # Not stored in GGUF: llama.cpp and transformers hard-code the local rope base
            # (10,000) and the 5 sliding : 1 full layer pattern.
            common.update(
                rope_theta_local=10000.0,
                sliding_window=int(get("attention.sliding_window", 512)),
                sliding_layers=tuple((i + 1) % 6 != 0 for i in range(n_layers)),
                qk_norm=True,
                post_norms=True,
                act="gelu_tanh",
                embed_scale=math.sqrt(hidden),
                tied_output="output.weight" not in tensor_names,
            )
        elif arch == "qwen2":
            common["qkv_bias"] = True
        elif arch == "qwen3":
            common["qk_norm"] = True
        return ModelConfig(**common)

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> ModelConfig:
        """Derive the config from a Hugging Face ``config.json`` dictionary."""
        if "text_config" in cfg:
            cfg = {**cfg, **cfg["text_config"]}
        mt = cfg.get("model_type", "")
        arch = {
            "llama": "llama",
            "mistral": "llama",
            "mixtral": "llama",
            "gemma3_text": "gemma3",
            "gemma3": "gemma3",
            "qwen2": "qwen2",
            "qwen3": "qwen3",
        }.get(mt)
        if arch is None:
            raise UnsupportedModelError(
                f"unsupported model_type {mt!r}; supported architectures: "
                f"{', '.join(SUPPORTED_ARCHS)}"
            )
        hidden = int(cfg["hidden_size"])
        n_heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or hidden // n_heads)
        n_layers = int(cfg["num_hidden_layers"])
        common: dict[str, Any] = dict(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=head_dim,
            ffn_dim=int(cfg["intermediate_size"]),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_hf_rope_theta(cfg)),
            context_length=int(cfg.get("max_position_embeddings", 2048)),
            tied_output=bool(cfg.get("tie_word_embeddings", arch == "gemma3")),
        )
        if mt == "mixtral":
            common["n_experts"] = int(cfg["num_local_experts"])
            common["n_experts_used"] = int(cfg["num_experts_per_tok"])
        if arch == "gemma3":
            layer_types = cfg.get("layer_types")
            if layer_types:
                sliding = tuple(t == "sliding_attention" for t in layer_types)
            else:
                pattern = int(cfg.get("sliding_window_pattern", 6))
                sliding = tuple((i + 1) % pattern != 0 for i in range(n_layers))
            common.update(
                rope_theta_local=_hf_local_rope_theta(cfg),
                sliding_window=int(cfg.get("sliding_window") or 512),
                sliding_layers=sliding,
                qk_norm=True,
                post_norms=True,
                act="gelu_tanh",
                embed_scale=math.sqrt(hidden),
                attn_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5,
            )
        elif arch == "qwen2":
            common["qkv_bias"] = True
        elif arch == "qwen3":
            common["qk_norm"] = True
        return ModelConfig(**common)


def _hf_rope_theta(cfg: dict[str, Any]) -> float:
    if "rope_theta" in cfg:
        return float(cfg["rope_theta"])
    rp = cfg.get("rope_parameters") or {}
    if "full_attention" in rp:  # gemma3 in newer transformers
        return float(rp["full_attention"].get("rope_theta", 10000.0))
    return float(rp.get("rope_theta", 10000.0))


def _hf_local_rope_theta(cfg: dict[str, Any]) -> float:
    if "rope_local_base_freq" in cfg:
        return float(cfg["rope_local_base_freq"])
    rp = cfg.get("rope_parameters") or {}
    return float(rp.get("sliding_attention", {}).get("rope_theta", 10000.0))
