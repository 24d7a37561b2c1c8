"""PEFT adapters on routed experts saved one module per expert, as transformers 4 laid MoE
models out (``model.layers.L.mlp.experts.N.gate_proj`` / ``up_proj`` / ``down_proj``; Mixtral's
``block_sparse_moe.experts.N.w1`` / ``w3`` / ``w2``): most MoE adapters trained before
transformers 5 stacked the experts look like this. They become one pair a stacked GGUF tensor,
A [E, r, in] and B [E, out, r] (expert e's own A and B at index e; an expert the adapter leaves
out gets zeros, a delta of zero), as `lora.peft_targets` does for the stacked form.

Where the base keeps gate and up in one tensor (``ffn_gate_up_exps`` [E, 2I, H]), their two
pairs become one of rank 2r: A = [A_gate; A_up] and B = [[B_gate, 0], [0, B_up]], whose product
is exactly [B_gate A_gate; B_up A_up]. A stack needs one rank and one scale factor over its
experts (and over gate and up when they are joined); anything else is refused, naming it.
"""

from __future__ import annotations

import re

import torch

from loraserve.model.config import ModelConfig

_PER_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|feed_forward|block_sparse_moe)"
                         r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)$")  # fmt: skip
_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down",
         "w2": "down"}  # fmt: skip

# (layer, part) -> expert -> (A [r, in], B [out, r], factor, float16)
Found = dict[tuple[int, str], dict[int, tuple[torch.Tensor, torch.Tensor, float, bool]]]
Pairs = dict[str, tuple[torch.Tensor, torch.Tensor, float, bool, bool]]


def expert_module(key: str) -> tuple[int, int, str] | None:
    """(layer, expert, "gate" | "up" | "down") of a per-expert module key (PEFT's prefix
    removed), else None."""
    m = _PER_EXPERT.match(key)
    return None if m is None else (int(m.group(1)), int(m.group(2)), _PART[m.group(3)])


def _stack(layer: int, part: str, experts: dict, n: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                   float, bool]:  # fmt: skip
    """One part's experts as A [E, r, in], B [E, out, r], their factor and whether all are
    float16."""
    where = f"layer {layer}'s experts' {part} projection"
    if max(experts) >= n:
        raise ValueError(f"{where}: expert {max(experts)}, but the model has {n} experts")
    shapes = {(tuple(a.shape), tuple(b.shape)) for a, b, _, _ in experts.values()}
    factors = {f for _, _, f, _ in experts.values()}
    if len(shapes) != 1:
        raise ValueError(f"{where}: the experts' lora_A / lora_B shapes differ: {sorted(shapes)}")
    if len(factors) != 1:
        raise ValueError(f"{where}: the experts' alpha / rank scale factors differ")
    (sa, sb), f16 = shapes.pop(), all(h for _, _, _, h in experts.values())
    if sa[0] != sb[1]:
        raise ValueError(f"{where}: lora_A {sa} and lora_B {sb} do not share a rank")
    dtype = torch.float16 if f16 else torch.float32
    a3 = torch.zeros((n, *sa), dtype=dtype)  # [E, r, in]
    b3 = torch.zeros((n, *sb), dtype=dtype)  # [E, out, r]
    for e, (a, b, _, _) in experts.items():
        a3[e], b3[e] = a, b
    return a3, b3, factors.pop(), f16


def stack_experts(found: Found, cfg: ModelConfig, base_shapes: dict[str, tuple[int, ...]]) -> Pairs:
    """The stacked pairs of every layer's per-expert modules (module docstring)."""
    pairs: Pairs = {}
    for layer in sorted({lay for lay, _ in found}):
        p = f"blk.{layer}."
        parts = {part: _stack(layer, part, found[(layer, part)], cfg.n_experts)
                 for lay, part in found if lay == layer}  # fmt: skip
        joined = p + "ffn_gate_up_exps.weight" in base_shapes
        if joined and ("gate" in parts or "up" in parts):
            pairs[p + "ffn_gate_up_exps.weight"] = _join(layer, parts, base_shapes[
                p + "ffn_gate_up_exps.weight"])  # fmt: skip
        for part in ("gate", "up", "down"):
            if part in parts and not (joined and part != "down"):
                a3, b3, f, f16 = parts[part]
                pairs[f"{p}ffn_{part}_exps.weight"] = (a3, b3, f, f16, False)
    return pairs


def _join(layer: int, parts: dict, base: tuple[int, ...]) -> tuple:
    """gate's and up's pairs as one of rank 2r on ffn_gate_up_exps [E, 2I, H] (a part the
    adapter leaves out is zeros)."""
    n, two_i = base[0], base[1]
    given = [parts[k] for k in ("gate", "up") if k in parts]
    if len({f for _, _, f, _ in given}) != 1:
        raise ValueError(f"layer {layer}'s experts: gate and up have different scale factors")
    a0, b0, f, _ = given[0]
    r, i = a0.shape[1], two_i // 2
    if b0.shape[1] != i or any(a.shape != a0.shape for a, _, _, _ in given):
        raise ValueError(f"layer {layer}'s experts: gate / up pairs do not fit [{n}, {two_i}, ..]")
    f16 = all(h for _, _, _, h in given)
    dtype = torch.float16 if f16 else torch.float32
    a = torch.zeros((n, 2 * r, a0.shape[2]), dtype=dtype)  # [E, 2r, H]: [A_gate; A_up]
    b = torch.zeros((n, two_i, 2 * r), dtype=dtype)  # [E, 2I, 2r]: block diagonal
    for k, half in enumerate(("gate", "up")):
        if half in parts:
            pa, pb, _, _ = parts[half]
            a[:, k * r : (k + 1) * r] = pa
            b[:, k * i : (k + 1) * i, k * r : (k + 1) * r] = pb
    return a, b, f, f16, False
