"""Hugging Face folders: config.json + *.safetensors, mapped to GGUF tensor names.

The decoder addresses weights (and adapters address targets) by GGUF names; this
module renames HF tensors lazily, stacks Mixtral experts, and folds Gemma's
``(1 + w)`` norm convention into the stored weight as GGUF files already do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from loraserve.model.config import ModelConfig

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_COMMON = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "block_sparse_moe.gate": "ffn_gate_inp",
    "mlp.gate": "ffn_gate_inp",
}
# Gemma has four norms per layer; llama-style models call their pre-FFN norm
# "post_attention_layernorm".
_GEMMA = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_LLAMA = {"post_attention_layernorm": "ffn_norm"}
# HF module name (as PEFT's target_modules see it) -> GGUF tensor stem.
HF_MODULE_TO_GGUF = {k.split(".")[-1]: v for k, v in _COMMON.items() if "norm" not in v}
# The other projections transformers' modules name (modeling_deepseek_v2, qwen2_moe, glm4_moe,
# ernie4_5_moe, hunyuan_v1_moe, llama4, granitemoeshared, starcoder2, phi3, glm4), under the
# names llama.cpp's converter gives them (gguf-py's TensorNameMap, which convert_lora_to_gguf
# also uses): latent attention's, shared experts' and fused ones. PEFT addresses them by these
# module names; tests/unit/lora/test_peft_names.py checks each against the TensorNameMap.
_MORE = {
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_b_proj": "attn_kv_b",
    "self_attn.qkv_proj": "attn_qkv",  # phi3: q|k|v fused
    "mlp.gate_up_proj": "ffn_up",  # phi3, glm4: gate|up fused in ffn_up
    "mlp.c_fc": "ffn_up",  # starcoder2
    "mlp.c_proj": "ffn_down",
    "feed_forward.gate_proj": "ffn_gate",  # llama4's dense layers
    "feed_forward.up_proj": "ffn_up",
    "feed_forward.down_proj": "ffn_down",
    "shared_mlp.output_linear": "ffn_down_shexp",  # granitemoeshared
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",  # qwen2moe
    "mlp.router": "ffn_gate_inp",  # routers (gpt-oss, granitemoe, llama4, hunyuan)
    "block_sparse_moe.router": "ffn_gate_inp",
    "feed_forward.router": "ffn_gate_inp",
    "mlp.gate.wg": "ffn_gate_inp",
}
for _shared in ("mlp.shared_experts", "mlp.shared_expert", "mlp.shared_mlp",
                "feed_forward.shared_expert"):  # fmt: skip
    for _p in ("gate", "up", "down"):
        _MORE[f"{_shared}.{_p}_proj"] = f"ffn_{_p}_shexp"


def hf_to_gguf_name(name: str, arch: str) -> str | None:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight`` (None if unknown)."""
    if name in ("model.embed_tokens.weight", "embed_tokens.weight"):
        return "token_embd.weight"
    if name in ("model.norm.weight", "norm.weight"):
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    m = _LAYER.match(name)
    if not m:
        return None
    layer, rest = m.groups()
    stem, _, kind = rest.rpartition(".")
    table = {**_COMMON, **_MORE, **(_GEMMA if arch in ("gemma2", "gemma3") else _LLAMA)}
    if stem in table:
        return f"blk.{layer}.{table[stem]}.{kind}"
    return None


class HFCheckpoint:
    """Lazy view of a HF folder's weights under GGUF names."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        cfg_path = self.path / "config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{self.path} has no config.json")
        self.hf_config: dict[str, Any] = json.loads(cfg_path.read_text())
        self.config = ModelConfig.from_hf(self.hf_config)
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{self.path} has no *.safetensors files")
        self._where: dict[str, tuple[Path, str]] = {}
        self._experts: dict[str, list[tuple[int, Path, str]]] = {}
        arch = self.config.arch
        exp = re.compile(
            r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$"
        )
        for f in files:
            with safe_open(str(f), "pt") as st:
                for key in st.keys():
                    m = exp.match(key)
                    if m:
                        layer, e, wn = m.groups()
                        stem = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}[
                            wn
                        ]
                        self._experts.setdefault(f"blk.{layer}.{stem}.weight", []).append(
                            (int(e), f, key)
                        )
                        continue
                    g = hf_to_gguf_name(key, arch)
                    if g is not None:
                        self._where[g] = (f, key)

    def names(self) -> set[str]:
        return set(self._where) | set(self._experts)

    def _read(self, f: Path, key: str, stored: bool) -> torch.Tensor:
        with safe_open(str(f), "pt") as st:
            t = st.get_tensor(key)
        keep = stored and t.dtype in (torch.float16, torch.bfloat16, torch.float32)
        return t if keep else t.float()

    def tensor(self, name: str, stored: bool = False) -> torch.Tensor | None:
        """The tensor under its GGUF name (float32, or with ``stored`` in its file's float16
        or bfloat16 when it is a matrix), or None."""
        if name in self._experts:
            parts = sorted(self._experts[name])
            return torch.stack([self._read(f, k, stored) for _, f, k in parts])
        if name not in self._where:
            return None
        t = self._read(*self._where[name], stored)
        if self.config.arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            t = t + 1.0  # GGUF stores Gemma's norms as (1 + w)
        return t
