"""What an architecture file declares (`Arch`), how it reads its GGUF keys (`Keys`), and the
tensor names every architecture shares (`TENSORS`, llama.cpp's ``src/llama-arch.cpp``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal


class UnsupportedModelError(ValueError):
    """The model file describes something loraserve cannot run."""


# llama.cpp's tensor names (LLM_TENSOR_* in src/llama-arch.cpp), per layer under ``blk.N.``;
# an architecture has the subset its layer kinds use.
TENSORS: dict[str, str] = {
    "token_embd": "token_embd",  # [V, hidden]
    "output_norm": "output_norm",
    "output": "output",  # absent: tied to token_embd
    "attn_norm": "attn_norm",  # pre-attention RMSNorm
    "attn_q": "attn_q",
    "attn_k": "attn_k",
    "attn_v": "attn_v",
    "attn_output": "attn_output",
    "attn_q_norm": "attn_q_norm",  # per-head RMSNorm of q [head_dim]
    "attn_k_norm": "attn_k_norm",
    "post_attention_norm": "post_attention_norm",  # on the attention output (gemma, olmo2)
    "ffn_norm": "ffn_norm",  # pre-FFN RMSNorm
    "post_ffw_norm": "post_ffw_norm",  # on the FFN output
    "ffn_gate": "ffn_gate",
    "ffn_up": "ffn_up",
    "ffn_down": "ffn_down",
    "ffn_gate_inp": "ffn_gate_inp",  # router [E, hidden]
    "ffn_gate_exps": "ffn_gate_exps",  # stacked experts [E, ffn, hidden]
    "ffn_up_exps": "ffn_up_exps",
    "ffn_down_exps": "ffn_down_exps",  # [E, hidden, ffn]
}


class Keys:
    """An architecture's GGUF hyper-parameters: ``keys.get("rope.freq_base")`` reads
    ``<arch>.rope.freq_base``; ``tensors`` holds the file's tensor names (a layer kind read
    from which tensors a layer has: jamba's expert layers)."""

    def __init__(self, meta: dict[str, Any], arch: str, tensors: frozenset[str] = frozenset()):
        self.meta, self.arch, self.tensors = meta, arch, tensors

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(f"{self.arch}.{key}", default)

    def req(self, key: str) -> Any:
        """A key the architecture cannot run without."""
        v = self.meta.get(f"{self.arch}.{key}")
        if v is None:
            raise UnsupportedModelError(f"GGUF metadata lacks {self.arch}.{key}")
        return v

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.meta


def swa_layers(keys: Keys, n_layers: int, n_pattern: int) -> tuple[bool, ...]:
    """Which layers use the sliding window, as llama.cpp's ``load_swa_pattern``: the per-layer
    array ``attention.sliding_window_pattern`` when the file has one, else a pattern of
    ``n_pattern`` (the key's scalar value if any): layer i slides when ``i % n < n - 1``."""
    v = keys.get("attention.sliding_window_pattern")
    if v is not None and not isinstance(v, (int, float)) and len(v) == n_layers:
        return tuple(bool(x) for x in v)
    n = int(v) if isinstance(v, (int, float)) else n_pattern
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layers))


Hook = Callable[[Keys, int], dict[str, Any]]
HFHook = Callable[[dict[str, Any], int], dict[str, Any]]


@dataclass(frozen=True)
class Arch:
    """One architecture, declared: its names, layer kinds and flags, and hooks reading its own
    hyper-parameters into `ModelConfig` fields (``gguf(keys, n_layers)``, ``hf(config,
    n_layers)``, each returning the fields that differ from the common reading)."""

    name: str  # llama.cpp's name, the GGUF general.architecture
    hf_types: tuple[str, ...] = ()  # Hugging Face model_type names read as this architecture
    # llama.cpp's rope type: "norm" rotates adjacent pairs (its converter permuted q/k rows,
    # undone at load so that rotating halves is the same), "neox" rotates halves
    rope: Literal["norm", "neox"] = "neox"
    qk_norm: bool = False  # per-head RMSNorm of q and k before rope
    qkv_bias: bool = False
    # projection stems whose bias the file holds but llama.cpp's graph never adds
    unused_biases: tuple[str, ...] = ()
    post_norms: bool = False  # RMSNorm on the attention and FFN outputs (gemma)
    act: Literal["silu", "gelu_tanh", "swiglu_oai"] = "silu"  # of the gated FFN
    embed_scale_sqrt: bool = False  # embeddings times sqrt(hidden) (gemma)
    # routed experts: "none", "optional" (when <arch>.expert_count > 0) or "required"
    experts: Literal["none", "optional", "required"] = "none"
    tied_default: bool = False  # output tied to token_embd when nothing says otherwise
    # the architecture reads rope.dimension_count itself (else one smaller than the head size
    # is a partial rope: `ModelConfig.rope_dim`)
    partial_rope: bool = False
    # some layers are recurrent (`model/recurrent/`): per-layer head counts, 0 at those layers,
    # whose kinds the gguf hook names (`ModelConfig.layer_kinds`)
    recurrent: bool = False
    # feed_forward_length may be absent (llama.cpp reads it optionally; 0 then): no layer has
    # a dense FFN, and the gguf hook derives the experts' width (qwen35moe, qwen3next)
    ffn_optional: bool = False
    gguf: Hook | None = None
    hf: HFHook | None = None
