"""Tiny random models for tests: a transformers model (the oracle) and the same weights
written as a GGUF file (and as an HF folder), so loraserve can be compared against it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from loraserve.model.loader import permute_qk

VOCAB = 320  # 3 specials + 256 bytes + 61 pieces


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: <unk>, <s>, </s>, byte pieces, a few words."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = [
        f"▁{w}" for w in "the a of and to in is it that was for on are as with his they".split()
    ]
    words += list("abcdefghijklmnopqrstuvwxyz") + ["▁"]
    while len(tokens) + len(words) < VOCAB:
        words.append(f"▁w{len(words)}")
    tokens += words[: VOCAB - len(tokens)]
    types += [1] * (VOCAB - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(VOCAB - 259)]
    return tokens, scores, types


def hf_model(arch: str, **over: Any) -> torch.nn.Module:
    """A random float32 transformers model: llama, gemma2, gemma3, qwen2, qwen3 or mixtral."""
    import transformers as tf

    torch.manual_seed(over.pop("seed", 0))
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        cfg = tf.LlamaConfig(**{**common, "rope_theta": 10000.0, **over})
        m = tf.LlamaForCausalLM(cfg)
    elif arch == "mixtral":
        cfg = tf.MixtralConfig(
            **{
                **common,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "rope_theta": 10000.0,
                **over,
            }
        )
        m = tf.MixtralForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**{**common, **over})
        m = tf.Qwen2ForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(**{**common, "head_dim": 16, **over})
        m = tf.Qwen3ForCausalLM(cfg)
    elif arch == "gemma3":
        n_layers = over.pop("num_hidden_layers", 6)
        cfg = tf.Gemma3TextConfig(
            **{
                **common,
                "num_hidden_layers": n_layers,
                "head_dim": 32,
                "query_pre_attn_scalar": 32,
                "sliding_window": 5,
                "tie_word_embeddings": True,
                "layer_types": [
                    "full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                    for i in range(n_layers)
                ],
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                },
                **over,
            }
        )
        m = tf.Gemma3ForCausalLM(cfg)
    elif arch == "gemma2":  # small caps, so that soft-capping shapes the scores and logits
        cfg = tf.Gemma2Config(
            **{
                **common,
                "head_dim": 32,
                "query_pre_attn_scalar": 32,
                "sliding_window": 5,
                "tie_word_embeddings": True,
                "attn_logit_softcapping": 2.0,
                "final_logit_softcapping": 3.0,
                **over,
            }
        )
        cfg._attn_implementation = "eager"  # the one transformers attention with capping
        m = tf.Gemma2ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # larger weights than the default init: logits that disagree loudly
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(torch.randn_like(p) * 0.2 + (0.0 if arch.startswith("gemma") else 1.0))
            else:
                p.copy_(torch.randn_like(p) * 0.1)
    return m.float().eval()


def _gguf_arch(arch: str) -> str:
    return "llama" if arch == "mixtral" else arch


def gguf_tensors(m: torch.nn.Module, arch: str) -> dict[str, torch.Tensor]:
    """The HF model's weights under GGUF names, in GGUF layout (llama q/k permuted, gemma 1+w)."""
    cfg = m.config
    out: dict[str, torch.Tensor] = {}
    sd = {k: v.detach().float() for k, v in m.state_dict().items()}
    garch = _gguf_arch(arch)
    from loraserve.model.hf import hf_to_gguf_name

    for k, v in sd.items():
        if ".mlp.experts." in k or k.endswith("rotary_emb.inv_freq"):
            continue
        name = hf_to_gguf_name(k, garch)
        if name is None:
            raise KeyError(k)
        if name == "output.weight" and cfg.tie_word_embeddings:
            continue
        if garch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
            v = permute_qk(v, heads)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            v = v + 1.0
        out[name] = v
    if arch == "mixtral":
        for i in range(cfg.num_hidden_layers):
            gu = sd[f"model.layers.{i}.mlp.experts.gate_up_proj"]  # [E, 2*ffn, hidden]
            f = cfg.intermediate_size
            out[f"blk.{i}.ffn_gate_exps.weight"] = gu[:, :f]
            out[f"blk.{i}.ffn_up_exps.weight"] = gu[:, f:]
            out[f"blk.{i}.ffn_down_exps.weight"] = sd[f"model.layers.{i}.mlp.experts.down_proj"]
    return out


def write_gguf(
    path: Path, m: torch.nn.Module, arch: str, quant: dict[str, GGMLQuantizationType] | None = None
) -> Path:
    """Write the model as GGUF; tensors named in ``quant`` are quantized (and the HF model's
    weights are replaced by their dequantized values so both sides hold the same numbers)."""
    cfg = m.config
    garch = _gguf_arch(arch)
    w = GGUFWriter(str(path), garch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch == "gemma3":
        w.add_rope_freq_base(1e6)
        w.add_sliding_window(cfg.sliding_window)
    elif arch == "gemma2":
        w.add_rope_freq_base(10000.0)
        w.add_sliding_window(cfg.sliding_window)
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    else:
        w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or 10000.0))
    if arch == "mixtral":
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    tokens, scores, types = tiny_vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    tensors = gguf_tensors(m, arch)
    quant = quant or {}
    for name, t in tensors.items():
        arr = t.numpy().astype(np.float32)
        qt = quant.get(name)
        if qt is not None:
            q = random_quant(arr.shape, qt) if qt in _SCALE_OFFSETS else quantize(arr, qt)
            w.add_tensor(name, q, raw_dtype=qt)
            _set_hf_weight(m, arch, name, torch.from_numpy(dequantize(q, qt).copy()))
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# f16 scale fields per block, for types gguf.quants cannot quantize: offsets in the block
_SCALE_OFFSETS = {
    GGMLQuantizationType.Q2_K: (80, 82),
    GGMLQuantizationType.Q3_K: (108,),
    GGMLQuantizationType.Q4_K: (0, 2),
    GGMLQuantizationType.Q5_K: (0, 2),
    GGMLQuantizationType.Q6_K: (208,),
}


def random_quant(shape: tuple[int, ...], qt: GGMLQuantizationType, seed: int = 0) -> np.ndarray:
    """Random valid K-quant blocks (small finite f16 scales) -> raw uint8 [rows, bytes]."""
    from gguf.constants import GGML_QUANT_SIZES

    block, tsize = GGML_QUANT_SIZES[qt]
    rows, cols = shape
    n_blocks = rows * cols // block
    rng = np.random.default_rng(seed + int(qt))
    raw = rng.integers(0, 256, size=(n_blocks, tsize), dtype=np.uint8)
    for off in _SCALE_OFFSETS[qt]:
        d = rng.uniform(0.0005, 0.004, size=n_blocks).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, cols // block * tsize)


def _set_hf_weight(m: torch.nn.Module, arch: str, name: str, value: torch.Tensor) -> None:
    from loraserve.model.hf import hf_to_gguf_name
    from loraserve.model.loader import unpermute_qk

    cfg = m.config
    if arch in ("llama", "mixtral") and name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
        value = unpermute_qk(value, heads)
    for k, p in m.state_dict().items():
        if hf_to_gguf_name(k, _gguf_arch(arch)) == name:
            with torch.no_grad():
                p.copy_(value.reshape(p.shape))
            return
    raise KeyError(name)


def hf_logits(m: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Full-sequence float32 logits [T, V] from transformers."""
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].float()


def our_logits(
    model: Any,
    ids: list[int],
    chunk: int,
    mix: dict[int, float] | None = None,
    lora_builder: Any = None,
) -> torch.Tensor:
    """loraserve's logits [T, V] for every position: a prefill chunk of ``chunk`` tokens,
    then one-token decode steps,
    through the runner over a non-trivial block table, under an optional adapter ``mix``."""
    from loraserve.engine.runner import BatchItem, ModelRunner
    from loraserve.model.context import set_context

    runner = ModelRunner(model.decoder, block_size=4, kv_dtype=torch.float32, lora=lora_builder)
    n_blocks = (len(ids) + 3) // 4
    runner.ensure_capacity(n_blocks + 2)
    blocks = list(range(2, 2 + n_blocks))[::-1]
    rows, pos = [], 0
    while pos < len(ids):
        n = min(chunk if pos == 0 else 1, len(ids) - pos)
        item = BatchItem(ids, pos, n, blocks, True, mix or {})
        _, _, ctx = runner._context([item])
        ctx.logits_rows = torch.arange(n)
        set_context(ctx)
        try:
            rows.append(model.decoder(torch.tensor(ids[pos : pos + n]), torch.arange(pos, pos + n)))
        finally:
            set_context(None)
        pos += n
    return torch.cat(rows)
