"""PEFT modules that adapt several GGUF tensors, or a stacked parameter, turned into loraserve's
pairs (issue 27 item 4): what `model.hf.hf_to_gguf_name`'s one-module-one-tensor map cannot say.

- Routed experts as transformers 5 stores them, one 3-D parameter per projection
  (``mlp.experts.gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]; gpt-oss and llama4 [E, in,
  out]), which PEFT adapts with ``target_parameters``: A [E r, in] (expert e's rows e r .. e r + r
  - 1) and B [out, E r] (expert e's columns e, E + e, ...: PEFT's ``ParamWrapper``). Two targeted
  parameters of one module nest, the first in the module's order innermost (``experts.
  base_layer.lora_A``). gate|up splits into ``ffn_gate_exps`` / ``ffn_up_exps`` (halves; gpt-oss
  interleaves them), or stays whole where the base holds ``ffn_gate_up_exps``.
- deepseek2's ``kv_b_proj`` [H (nope + v), rank], which llama.cpp's converter splits into
  ``attn_k_b`` [H, rank, nope] (transposed) and ``attn_v_b`` [H, v, rank]: with B's rows per head
  ``[Bk_h | Bv_h]``, ``v_b``'s delta is ``Bv_h A`` (A shared) and ``k_b``'s ``(Bk_h A)^T = A^T
  Bk_h^T``: pairs (``Bk_h^T``, ``A^T``), the same rank.
- Fused modules on a base that stores the parts: ``qkv_proj`` on attn_q/k/v, granitemoeshared's
  ``shared_mlp.input_linear`` (gate|up) on ffn_gate_shexp / ffn_up_shexp: B's rows split, A shared.

Each pair is exact: the deltas of the pairs are the module's delta, as llama.cpp converts it.
"""

from __future__ import annotations

import re

import torch

from loraserve.model.config import ModelConfig
from loraserve.model.hf import hf_to_gguf_name

Split = list[tuple[str, torch.Tensor, torch.Tensor]]  # (GGUF target, A, B)
_EXPERTS = re.compile(r"^model\.layers\.(\d+)\.(mlp|feed_forward|block_sparse_moe)\.experts"
                      r"((?:\.base_layer)*)$")  # fmt: skip
_ORDER = ("gate_up_proj", "down_proj")  # the parameters' order in transformers' expert modules
_INTERLEAVED = ("gpt-oss",)  # gate_up columns alternate gate, up (GptOssExperts)


def split_module(
    key: str,
    a: torch.Tensor,
    b: torch.Tensor,
    cfg: ModelConfig,
    base_shapes: dict[str, tuple[int, ...]],
    target_parameters: list[str],
) -> Split | None:
    """The pairs of module ``key`` (``model.layers.3.self_attn.kv_b_proj``, PEFT's prefix
    removed) with A [r', in] and B [out, r'], or None when it is not one of these modules."""
    m = _EXPERTS.match(key)
    if m is not None:
        return _experts(int(m.group(1)), m.group(3).count(".base_layer"), a, b, cfg,
                        base_shapes, target_parameters, key)  # fmt: skip
    target = hf_to_gguf_name(key + ".weight", cfg.arch)
    if target is not None and target in base_shapes:
        return None  # one tensor: the plain map
    layer = key.split(".")[2] if key.startswith("model.layers.") else ""
    p = f"blk.{layer}."
    if key.endswith(".self_attn.kv_b_proj") and p + "attn_v_b.weight" in base_shapes:
        return _kv_b(p, a, b, cfg, base_shapes)
    if key.endswith(".self_attn.qkv_proj"):
        nq, nkv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        return _rows(p, ("attn_q", "attn_k", "attn_v"), (nq, nkv, nkv), a, b)
    if key.endswith(".shared_mlp.input_linear"):
        half = b.shape[0] // 2
        return _rows(p, ("ffn_gate_shexp", "ffn_up_shexp"), (half, half), a, b)
    return None


def _rows(p: str, stems: tuple[str, ...], sizes: tuple[int, ...], a: torch.Tensor,
          b: torch.Tensor) -> Split:  # fmt: skip
    """B's rows in consecutive blocks of ``sizes``, one target each, A shared."""
    if sum(sizes) != b.shape[0]:
        raise ValueError(f"lora_B has {b.shape[0]} rows, expected {sum(sizes)}")
    return [(f"{p}{s}.weight", a, part.contiguous())
            for s, part in zip(stems, b.split(list(sizes)), strict=True)]  # fmt: skip


def _kv_b(p: str, a: torch.Tensor, b: torch.Tensor, cfg: ModelConfig,
          base_shapes: dict[str, tuple[int, ...]]) -> Split:  # fmt: skip
    """kv_b_proj's pair as attn_k_b's and attn_v_b's, per head (module docstring)."""
    h, nope, dv, r = cfg.n_heads, cfg.qk_nope_dim, cfg.v_head_dim, a.shape[0]
    if b.shape[0] != h * (nope + dv):
        raise ValueError(f"kv_b_proj's lora_B has {b.shape[0]} rows, expected {h * (nope + dv)}")
    bh = b.view(h, nope + dv, r)
    bk, bv = bh[:, :nope], bh[:, nope:]  # [H, nope, r], [H, dv, r]
    k_a, k_b = bk.transpose(1, 2), a.t().expand(h, -1, -1)  # [H, r, nope], [H, rank, r]
    v_a, v_b = a.expand(h, -1, -1), bv  # [H, r, rank], [H, dv, r]
    out = []
    for stem, pa, pb in (("attn_k_b", k_a, k_b), ("attn_v_b", v_a, v_b)):
        name = f"{p}{stem}.weight"
        if len(base_shapes.get(name, ())) == 2:  # one head, stored as a projection
            pa, pb = pa[0], pb[0]
        out.append((name, pa.contiguous(), pb.contiguous()))
    return out


def _experts(layer: int, depth: int, a: torch.Tensor, b: torch.Tensor, cfg: ModelConfig,
             base_shapes: dict[str, tuple[int, ...]], target_parameters: list[str],
             key: str) -> Split:  # fmt: skip
    """A stacked expert parameter's pair: which parameter from its nesting depth, per expert
    A [E, r, in] and B [E, out, r], gate|up split where the base keeps them apart."""
    targeted = [n for n in _ORDER if any(t == n or t.endswith("." + n) for t in target_parameters)]
    if depth >= len(targeted):
        raise ValueError(f"{key}: no targeted expert parameter at nesting depth {depth}")
    param = targeted[len(targeted) - 1 - depth]  # the first in order is the innermost
    p = f"blk.{layer}."
    e = cfg.n_experts
    if e <= 0 or a.shape[0] % e or b.shape[1] != a.shape[0]:
        raise ValueError(f"{key}: A {tuple(a.shape)} / B {tuple(b.shape)} for {e} experts")
    r = a.shape[0] // e
    a3 = a.reshape(e, r, a.shape[1])  # [E, r, in]
    b3 = b.reshape(b.shape[0], r, e).permute(2, 0, 1)  # [E, out, r]
    if param == "down_proj":
        return [(p + "ffn_down_exps.weight", a3.contiguous(), b3.contiguous())]
    n = b3.shape[1] // 2
    if cfg.arch in _INTERLEAVED:
        gate, up = b3[:, 0::2], b3[:, 1::2]
    else:
        if p + "ffn_gate_up_exps.weight" in base_shapes:
            return [(p + "ffn_gate_up_exps.weight", a3.contiguous(), b3.contiguous())]
        gate, up = b3[:, :n], b3[:, n:]
    return [(p + "ffn_gate_exps.weight", a3.contiguous(), gate.contiguous()),
            (p + "ffn_up_exps.weight", a3.contiguous(), up.contiguous())]  # fmt: skip
