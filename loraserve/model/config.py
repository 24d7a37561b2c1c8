"""`ModelConfig`: the one frozen description of a decoder, derived from GGUF or HF metadata.

Architectures differ only by fields here (norm placement, activation, biases, rope bases and
layout, which layer kind sits at which depth, experts); each architecture's file in `archs/`
says which, and the decoder in `decoder.py` reads these fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from loraserve.model import archs
from loraserve.model.archs import UnsupportedModelError
from loraserve.model.attn.rope_scaling import RopeScaling, read_scaling

__all__ = ["SUPPORTED_ARCHS", "ModelConfig", "UnsupportedModelError"]

SUPPORTED_ARCHS = archs.supported()


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
    unused_biases: tuple[str, ...] = ()  # stems whose file bias is not applied (llama.cpp's)
    post_norms: bool = False  # gemma: post_attention_norm and post_ffw_norm
    act: str = "silu"  # "silu" or "gelu_tanh" (gated in both cases)
    embed_scale: float = 1.0  # gemma: sqrt(hidden_size)
    attn_scale: float = 0.0  # softmax scale; 0 -> 1/sqrt(head_dim)
    tied_output: bool = False
    n_experts: int = 0  # 0 = dense FFN
    n_experts_used: int = 0
    expert_ffn_dim: int = 0  # routed experts' width (0: ffn_dim)
    expert_norm: bool = True  # the chosen experts' weights renormalised to sum 1
    expert_scale: float = 0.0  # the chosen weights times this (0 or 1: unscaled)
    moe_latent: int = 0  # routed experts' width in and out when not hidden (nemotron_h_moe)
    # q/k RMSNorm (with qk_norm): "head" per head before rope; "full" over all heads' width
    # before rope (olmo2, olmoe, minimax-m2); "head_after_rope" per head after rope (hunyuan);
    # "head_if_present": per head before rope in the layers whose file has them (glm4moe)
    qk_norm_mode: str = "head"
    # dense FFN: "gated" (ffn_gate, ffn_up), "fused" (ffn_up holds gate|up: glm4, phi3) or
    # "plain" (act(ffn_up) alone: starcoder2)
    ffn_kind: str = "gated"
    pre_norms: bool = True  # False: no norm before attention and FFN (olmo2: post norms only)
    residual_scale: float = 1.0  # attention and FFN outputs times this before each residual add
    # GGUF tensor stems that differ from `archs.TENSORS` (role -> stem), e.g. a pre-FFN norm
    # stored as post_attention_norm (seed_oss)
    tensor_names: tuple[tuple[str, str], ...] = ()
    # llama.cpp's rope layout: "norm" (adjacent pairs: GGUF q/k rows unpermuted at load) or
    # "neox" (halves, what the decoder rotates)
    rope_type: str = ""  # "": the architecture's (`archs`)
    # layer kinds by depth (empty: the same kind at every depth)
    rope_layers: tuple[bool, ...] = field(default=())  # per layer: q/k rotated (False: no rope)
    moe_layers: tuple[bool, ...] = field(default=())  # per layer: routed experts (else dense)
    # attention, norm and output variants (gemma2, gpt-oss, phi3, cohere2)
    attn_softcap: float = 0.0  # > 0: each score s -> cap * tanh(s / cap) (gemma2)
    attn_sinks: bool = False  # a learned sink logit per head joins the softmax (gpt-oss)
    final_softcap: float = 0.0  # > 0: the same capping of the logits (gemma2)
    logit_scale: float = 1.0  # the logits times this (cohere2; granite: 1 / its logit_scale)
    norm: str = "rms"  # "rms", or "layer": LayerNorm (mean removed) with rms_eps (cohere2)
    parallel: bool = False  # FFN reads the attention's input norm; both join the residual
    ffn_norm_name: str = "ffn_norm"  # the pre-FFN norm's tensor (gpt-oss: post_attention_norm)
    # routed experts' weights: "softmax" (softmax, top-k, renormalised: llama), "softmax_weight"
    # (top-k logits, softmax over them: gpt-oss), "sigmoid" (sigmoid, top-k: deepseek2)
    expert_gating: str = "softmax"
    # multi-head latent attention (deepseek2; 0: none): the cache row is the compressed KV
    # (kv_lora_rank) and the rope key (rope_dim), head_dim = their sum with one KV head
    kv_lora_rank: int = 0
    # rotated dims when not head_dim: latent attention's rope part, or a partial rope (the
    # first rope_dim dims of each q/k head rotated, in the architecture's layout, the rest not)
    rope_dim: int = 0
    qk_nope_dim: int = 0  # a latent-attention head's query dims without rope
    v_head_dim: int = 0  # a latent-attention head's value dims
    # recurrent layers (`model/recurrent/`): per layer "attn" or a recurrent kind
    # ("shortconv"); empty: attention at every depth
    layer_kinds: tuple[str, ...] = field(default=())
    conv_kernel: int = 0  # short convolution's kernel length (lfm2: shortconv.l_cache)
    # Mamba-2 layers: (d_conv, d_inner, d_state, heads, groups) from <arch>.ssm.*
    ssm: tuple[int, ...] = ()
    # delta-net and Mamba-2 scans: 0 runs them token by token (the recurrent form), C > 0
    # in chunks of C rows at absolute positions (`--scan-form chunked`, `recurrent/chunked.py`)
    scan_chunk: int = 0
    ffn_layers: tuple[bool, ...] = field(default=())  # per layer: has an FFN (mamba2: none)
    # attn_q holds each head's query then its output gate (2 head_dim); the attention output is
    # multiplied by sigmoid(gate) before attn_output (qwen3next, qwen35)
    attn_out_gate: bool = False
    # llama4: sliding_layers attend in chunks of attn_chunk positions (a query sees the keys of
    # its own chunk only); no-rope layers scale q by 1 + s log(floor((pos + o) / f) + 1) with
    # attn_temp = (f, s, o); q and k RMS-normed without weight after rope on rope layers;
    # attn_temp_all (mistral3): every layer's q after rope, (f, s, o) = (original ctx, s, 0)
    attn_chunk: int = 0
    attn_temp: tuple[float, ...] = ()
    attn_temp_all: bool = False
    qk_l2_norm: bool = False
    # llama4: a routed expert's weight multiplies its input (not its output), and the top-k
    # is chosen by the router's raw logits
    expert_weight_input: bool = False
    # rope frequency scaling (linear, YaRN, LongRoPE: `attn.rope_scaling`) of the global
    # layers; sliding layers keep the frequencies unscaled unless local_rope_scaled (llama.cpp's
    # rope_freq_scale_train_swa)
    rope_scaling: RopeScaling = RopeScaling()
    local_rope_scaled: bool = False

    def __post_init__(self) -> None:
        arch = archs.get(self.arch)  # refuses an unknown architecture
        if not self.rope_type:
            object.__setattr__(self, "rope_type", arch.rope)
        if not self.sliding_layers:
            object.__setattr__(self, "sliding_layers", (False,) * self.n_layers)
        if not self.rope_layers:
            object.__setattr__(self, "rope_layers", (True,) * self.n_layers)
        if not self.ffn_layers:
            object.__setattr__(self, "ffn_layers", (True,) * self.n_layers)
        if not self.layer_kinds:
            object.__setattr__(self, "layer_kinds", ("attn",) * self.n_layers)
        if not self.moe_layers:
            object.__setattr__(self, "moe_layers", (self.n_experts > 0,) * self.n_layers)
        if self.rope_theta_local == 0.0:
            object.__setattr__(self, "rope_theta_local", self.rope_theta)
        if self.attn_scale == 0.0:
            object.__setattr__(self, "attn_scale", 1.0 / math.sqrt(self.head_dim))
        for name in ("sliding_layers", "rope_layers", "moe_layers", "layer_kinds", "ffn_layers"):
            if len(getattr(self, name)) != self.n_layers:
                raise UnsupportedModelError(f"{name} must have one entry per layer")
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedModelError("n_heads must be a multiple of n_kv_heads")

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def tensor(self, role: str) -> str:
        """The GGUF stem of a tensor role (`archs.TENSORS`) in this architecture."""
        return dict(self.tensor_names).get(role, role)

    @property
    def partial_rope(self) -> bool:
        """Whether q/k heads rotate only their first ``rope_dim`` dims (not latent attention)."""
        return not self.kv_lora_rank and 0 < self.rope_dim < self.head_dim

    @property
    def recurrent(self) -> bool:
        """Whether some layer keeps per-sequence recurrent state (`cache.state`)."""
        return any(k != "attn" for k in self.layer_kinds)

    @property
    def permuted_qk(self) -> bool:
        """Whether a GGUF file stores q/k rows in llama.cpp's converter order (rope "norm")
        that loading un-permutes; a partial rope rotates the stored adjacent pairs as they are."""
        return self.rope_type == "norm" and not self.partial_rope

    @staticmethod
    def from_gguf(meta: dict[str, Any], tensor_names: set[str] | None = None) -> ModelConfig:
        """Derive the config from GGUF metadata (keys like ``llama.block_count``): the keys every
        architecture shares here, its own in its `archs` file."""
        arch = archs.get(str(meta.get("general.architecture", "")))
        tensor_names = tensor_names or set()
        keys = archs.Keys(meta, arch.name, frozenset(tensor_names))
        hidden = int(keys.req("embedding_length"))
        n_heads = _heads(arch, keys.req("attention.head_count"))
        n_kv = keys.get("attention.head_count_kv", n_heads)
        if arch.recurrent:  # per-layer counts, 0 at recurrent layers: the attention's
            n_kv = _heads(arch, n_kv)
        if isinstance(n_kv, list) or hasattr(n_kv, "shape"):
            raise UnsupportedModelError("per-layer head_count_kv is not supported")
        n_layers = int(keys.req("block_count"))
        vocab = len(meta["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in meta else None
        vocab = int(keys.get("vocab_size", vocab or 0))
        n_experts = int(keys.get("expert_count", 0)) if arch.experts != "none" else 0
        if arch.experts == "required" and n_experts == 0:
            raise UnsupportedModelError(
                f"{arch.name}: GGUF metadata lacks {arch.name}.expert_count"
            )
        fields: dict[str, Any] = dict(
            arch=arch.name,
            vocab_size=vocab,
            hidden_size=hidden,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(n_kv),
            head_dim=int(keys.get("attention.key_length", hidden // n_heads)),
            ffn_dim=_ffn(arch, keys),  # per layer: nemotron-h
            rms_eps=float(keys.get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(keys.get("rope.freq_base", 10000.0)),
            context_length=int(keys.get("context_length", 2048)),
            tied_output=(
                "output.weight" not in tensor_names if tensor_names else arch.tied_default
            ),
            n_experts=n_experts,
            n_experts_used=int(keys.get("expert_used_count", 0)) if n_experts else 0,
            expert_ffn_dim=int(keys.get("expert_feed_forward_length", 0)) if n_experts else 0,
        )
        n_rot = keys.get("rope.dimension_count")
        if n_rot is not None and int(n_rot) != fields["head_dim"] and not arch.partial_rope:
            if not 0 < int(n_rot) < fields["head_dim"] or int(n_rot) % 2:
                raise UnsupportedModelError(
                    f"{arch.name}: rope on {n_rot} of {fields['head_dim']} head dimensions"
                )
            fields["rope_dim"] = int(n_rot)  # partial rope: the first n_rot dims of each head
        fields["rope_scaling"] = read_scaling(keys, fields["context_length"])
        fields.update(_flags(arch, hidden))
        if arch.gguf is not None:
            fields.update(arch.gguf(keys, n_layers))
        return ModelConfig(**fields)

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> ModelConfig:
        """Derive the config from a Hugging Face ``config.json`` dictionary."""
        if "text_config" in cfg:
            cfg = {**cfg, **cfg["text_config"]}
        arch = archs.by_hf_type(str(cfg.get("model_type", "")))
        hidden = int(cfg["hidden_size"])
        n_heads = int(cfg["num_attention_heads"])
        n_layers = int(cfg["num_hidden_layers"])
        fields: dict[str, Any] = dict(
            arch=arch.name,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or hidden // n_heads),
            ffn_dim=int(cfg["intermediate_size"]),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_hf_rope_theta(cfg)),
            context_length=int(cfg.get("max_position_embeddings", 2048)),
            tied_output=bool(cfg.get("tie_word_embeddings", arch.tied_default)),
        )
        if "num_local_experts" in cfg:  # mixtral
            fields["n_experts"] = int(cfg["num_local_experts"])
            fields["n_experts_used"] = int(cfg["num_experts_per_tok"])
        fields.update(_flags(arch, hidden))
        if arch.hf is not None:
            fields.update(arch.hf(cfg, n_layers))
        return ModelConfig(**fields)


def _flags(arch: archs.Arch, hidden: int) -> dict[str, Any]:
    """The fields an architecture declares as flags."""
    return dict(
        qk_norm=arch.qk_norm,
        qkv_bias=arch.qkv_bias,
        unused_biases=arch.unused_biases,
        post_norms=arch.post_norms,
        act=arch.act,
        embed_scale=math.sqrt(hidden) if arch.embed_scale_sqrt else 1.0,
        rope_type=arch.rope,
    )


def _ffn(arch: archs.Arch, keys: archs.Keys) -> int:
    """The dense FFN width (`_heads`' reading); 0 where the architecture has no dense FFN and
    the file leaves the key out (`Arch.ffn_optional`)."""
    if arch.ffn_optional and not keys.has("feed_forward_length"):
        return 0
    return _heads(arch, keys.req("feed_forward_length"))


def _heads(arch: archs.Arch, v: Any) -> int:
    """A head count: per layer in a recurrent architecture (0 at its recurrent layers), the
    attention layers' (they must agree); else one value."""
    if arch.recurrent and (isinstance(v, list) or hasattr(v, "shape")):
        counts = {int(x) for x in v} - {0}
        if not counts:  # no layer of that kind (llama.cpp loads it): a size nothing reads
            return 1
        if len(counts) != 1:
            raise UnsupportedModelError(f"{arch.name}: attention layers with head counts {v}")
        return counts.pop()
    return int(v)


def _hf_rope_theta(cfg: dict[str, Any]) -> float:
    if "rope_theta" in cfg:
        return float(cfg["rope_theta"])
    rp = cfg.get("rope_parameters") or {}
    if "full_attention" in rp:  # gemma3 in newer transformers
        return float(rp["full_attention"].get("rope_theta", 10000.0))
    return float(rp.get("rope_theta", 10000.0))
