"""A Qwen3.5 file with a multi-token-prediction block (``nextn_predict_layers`` 1): the
recorded 2-layer ``qwen35`` spec of `tests.arch_models` plus one MTP block ``blk.2`` as
llama.cpp's loader names and shapes it (src/models/qwen35.cpp ``load_block_mtp``: a gated
full-attention decoder block and the ``nextn.*`` tensors). Each tensor's values are drawn
from its own name, so the first two layers are those of the recorded file."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "archs"


def mtp_spec() -> dict[str, Any]:
    """The qwen35 dense spec with block_count 3, one nextn layer and its tensors."""
    spec = copy.deepcopy(json.loads((DATA / "qwen35.json").read_text())["variants"]["dense"])
    h, hd, heads, kv, ff = 256, 128, 2, 2, 384
    fix = {"qwen35.block_count": 3, "qwen35.nextn_predict_layers": 1,
           "qwen35.attention.recurrent_layers": [1, 0, 0]}  # fmt: skip
    spec["metadata"] = [[k, t, fix.get(k, v)] for k, t, v in spec["metadata"]]
    b = "blk.2."
    spec["tensors"] += [[n, s, 0] for n, s in [
        (b + "attn_norm.weight", [h]), (b + "post_attention_norm.weight", [h]),
        (b + "attn_q.weight", [2 * heads * hd, h]), (b + "attn_k.weight", [kv * hd, h]),
        (b + "attn_v.weight", [kv * hd, h]), (b + "attn_output.weight", [h, heads * hd]),
        (b + "attn_q_norm.weight", [hd]), (b + "attn_k_norm.weight", [hd]),
        (b + "ffn_gate.weight", [ff, h]), (b + "ffn_up.weight", [ff, h]),
        (b + "ffn_down.weight", [h, ff]), (b + "nextn.eh_proj.weight", [h, 2 * h]),
        (b + "nextn.enorm.weight", [h]), (b + "nextn.hnorm.weight", [h]),
        (b + "nextn.shared_head_norm.weight", [h]),
    ]]  # fmt: skip
    return spec
