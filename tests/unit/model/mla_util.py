"""The recorded tiny deepseek2 (latent attention) with several query heads, as DeepSeek-V2-Lite
stores them: its per-head ``attn_k_b`` / ``attn_v_b`` stacks 3-D in the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEC = Path(__file__).resolve().parents[2] / "data" / "archs" / "deepseek2.json"
HEADS = 3


def mla_spec() -> dict[str, Any]:
    """The recorded tiny deepseek2 with HEADS query heads (every head-sized tensor resized)."""
    spec = json.loads(SPEC.read_text())["variants"]["moe"]
    meta = {k: v for k, _, v in spec["metadata"]}
    qd, dv = (
        int(meta["deepseek2.attention.key_length_mla"]),
        int(meta["deepseek2.attention.value_length_mla"]),
    )
    tensors = []
    for name, shape, t in spec["tensors"]:
        if name.endswith((".attn_k_b.weight", ".attn_v_b.weight")):
            shape = [HEADS, *shape]
        elif name.endswith(".attn_q_b.weight"):
            shape = [HEADS * qd, shape[1]]
        elif name.endswith(".attn_output.weight"):
            shape = [shape[0], HEADS * dv]
        tensors.append([name, shape, t])
    metadata = [[k, vt, HEADS if k == "deepseek2.attention.head_count" else v]
                for k, vt, v in spec["metadata"]]  # fmt: skip
    return {**spec, "tensors": tensors, "metadata": metadata}
