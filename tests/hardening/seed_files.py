"""The seed files the hardening tests mutate: a tiny llama and a Q8_0 Gemma-shaped model written
by our GGUF writer, a tiny LoRA adapter for the llama, the shipped demo adapters, and the
base shapes an adapter's tensors name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[2]


ADAPTERS = ROOT / "loraserve" / "adapters"


def tiny(path: Path, arch: str) -> Path:
    """A tiny random model written by our GGUF writer (no transformers needed): 2 layers,
    hidden 64, 4 heads and 2 KV heads, FFN 96; gemma3's matrices Q8_0 (its layers then run
    in the fused C call), llama's float32 with an output matrix."""
    import torch

    from loraserve.model.gguf_write import write_gguf
    from tests.tiny import tiny_vocab

    g = torch.Generator().manual_seed(5)
    d = 32 if arch == "gemma3" else 16
    tokens, scores, types = tiny_vocab()
    meta: dict[str, Any] = {
        "general.architecture": arch, f"{arch}.block_count": 2,
        f"{arch}.context_length": 256, f"{arch}.embedding_length": 64,
        f"{arch}.feed_forward_length": 96, f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2, f"{arch}.attention.key_length": d,
        f"{arch}.attention.value_length": d, f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
    }  # fmt: skip
    if arch == "gemma3":
        meta["gemma3.attention.sliding_window"] = 5
    shapes = {"token_embd.weight": (320, 64), "output_norm.weight": (64,)}
    if arch == "llama":
        shapes["output.weight"] = (320, 64)
    for i in range(2):
        p = f"blk.{i}."
        shapes |= {p + "attn_norm.weight": (64,), p + "attn_q.weight": (4 * d, 64),
                   p + "attn_k.weight": (2 * d, 64), p + "attn_v.weight": (2 * d, 64),
                   p + "attn_output.weight": (64, 4 * d), p + "ffn_norm.weight": (64,),
                   p + "ffn_gate.weight": (96, 64), p + "ffn_up.weight": (96, 64),
                   p + "ffn_down.weight": (64, 96)}  # fmt: skip
        if arch == "gemma3":
            shapes |= {p + "attn_q_norm.weight": (d,), p + "attn_k_norm.weight": (d,),
                       p + "post_attention_norm.weight": (64,),
                       p + "post_ffw_norm.weight": (64,)}  # fmt: skip
    tensors = {
        n: torch.randn(shp, generator=g) * 0.1 + (len(shp) == 1) for n, shp in shapes.items()
    }
    q8 = {
        n: 8
        for n, t in tensors.items()
        if arch == "gemma3" and n.startswith("blk.") and t.dim() == 2
    }
    return write_gguf(path, meta, tensors, q8)


def tiny_lora(path: Path) -> Path:
    """A GGUF LoRA of rank 4 for the tiny Gemma's q, v and down projections."""
    import torch

    from loraserve.model.gguf_write import write_gguf

    g = torch.Generator().manual_seed(6)
    meta = {"general.architecture": "gemma3", "general.type": "adapter",
            "adapter.type": "lora", "adapter.lora.alpha": 8.0}  # fmt: skip
    tensors = {}
    for i in range(2):
        for stem, (out, inp) in (("attn_q", (128, 64)), ("attn_v", (64, 64)),
                                 ("ffn_down", (64, 96))):  # fmt: skip
            tensors[f"blk.{i}.{stem}.weight.lora_a"] = torch.randn(4, inp, generator=g) * 0.1
            tensors[f"blk.{i}.{stem}.weight.lora_b"] = torch.randn(out, 4, generator=g) * 0.1
    return write_gguf(path, meta, tensors)


def seed_models(folder: Path) -> dict[str, Path]:
    return {"gemma_q8": tiny(folder / "gemma_q8.gguf", "gemma3"),
            "llama": tiny(folder / "llama.gguf", "llama")}  # fmt: skip


def base_shapes(adapter: Path) -> dict[str, list[int]]:
    """The base tensors the demo adapter fits: (out, in) of each target, from its own pairs."""
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as st:
        dims = {k: st.get_slice(k).get_shape() for k in st.keys()}
    from loraserve.lora.adapter import _module_key
    from loraserve.model.hf import hf_to_gguf_name

    out = {}
    for k, a in dims.items():
        if ".lora_A." in k:
            module = k.split(".lora_A.")[0]
            b = dims[k.replace(".lora_A.", ".lora_B.")]
            out[hf_to_gguf_name(_module_key(module) + ".weight", "gemma3")] = [b[0], a[1]]
    return out
