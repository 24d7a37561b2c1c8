"""qwen35 (gated delta-net beside gated attention) against transformers float32, on the same
random weights: an independent implementation of the delta rule (its chunked torch form),
the gated RMSNorm, the query|gate attention and a partial rope.

A tiny model (n_embd 256, the `test` vocabulary, delta-net at layer 0 with 2 key and 2 value
heads of 128, gated attention with rope on 64 of its 128 dims at layer 1) is written by
loraserve's GGUF writer from a seed; the same values, renamed as llama.cpp's converter maps
them (its norms stored as 1 + w, ``ssm_a`` = -exp(A_log)), load into transformers'
`Qwen3_5ForCausalLM`. loraserve's float32 log-probabilities of every position of a prompt
longer than several blocks must match within 1e-3, with the same argmax wherever the top two
differ by more than 1e-3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.arch_models import tensor_values
from tests.unit.model.recurrent_hf_util import (
    PROMPT,
    as_tensor,
    compare,
    hf_prompt_logits,
    ours_logits,
)

transformers = pytest.importorskip("transformers")
qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

H, FF, V, S, HEADS = 256, 384, 128, 128, 2
A = "qwen35"


def _spec() -> dict[str, Any]:
    meta = [["general.architecture", "STRING", A], ["general.name", "STRING", "n/a"],
            [f"{A}.vocab_size", "UINT32", V], [f"{A}.context_length", "UINT32", 256],
            [f"{A}.embedding_length", "UINT32", H], [f"{A}.block_count", "UINT32", 2],
            [f"{A}.feed_forward_length", "UINT32", FF],
            [f"{A}.attention.head_count", "UINT32", HEADS],
            [f"{A}.attention.head_count_kv", "UINT32", HEADS],
            [f"{A}.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-6],
            [f"{A}.rope.freq_base", "FLOAT32", 10000.0],
            [f"{A}.rope.dimension_count", "UINT32", 64],
            [f"{A}.ssm.conv_kernel", "UINT32", 4], [f"{A}.ssm.inner_size", "UINT32", 2 * S],
            [f"{A}.ssm.state_size", "UINT32", S], [f"{A}.ssm.time_step_rank", "UINT32", 2],
            [f"{A}.ssm.group_count", "UINT32", 2], [f"{A}.full_attention_interval", "UINT32", 2],
            ["tokenizer.ggml.model", "STRING", "test"],
            ["tokenizer.ggml.tokens", "ARRAY:STRING", [f"tok_{i}" for i in range(V)]]]  # fmt: skip
    t = [["token_embd.weight", [V, H], 0], ["output_norm.weight", [H], 0],
         ["output.weight", [V, H], 0]]  # fmt: skip
    for i in range(2):
        p = f"blk.{i}."
        t += [[p + "attn_norm.weight", [H], 0], [p + "post_attention_norm.weight", [H], 0],
              [p + "ffn_gate.weight", [FF, H], 0], [p + "ffn_up.weight", [FF, H], 0],
              [p + "ffn_down.weight", [H, FF], 0]]  # fmt: skip
    conv = 4 * S + 2 * S
    t += [["blk.0.attn_qkv.weight", [conv, H], 0], ["blk.0.attn_gate.weight", [2 * S, H], 0],
          ["blk.0.ssm_beta.weight", [2, H], 0], ["blk.0.ssm_alpha.weight", [2, H], 0],
          ["blk.0.ssm_conv1d.weight", [conv, 4], 0], ["blk.0.ssm_dt.bias", [2], 0],
          ["blk.0.ssm_a", [2], 0], ["blk.0.ssm_norm.weight", [S], 0],
          ["blk.0.ssm_out.weight", [H, 2 * S], 0],
          ["blk.1.attn_q.weight", [2 * HEADS * 128, H], 0],
          ["blk.1.attn_k.weight", [HEADS * 128, H], 0],
          ["blk.1.attn_v.weight", [HEADS * 128, H], 0],
          ["blk.1.attn_output.weight", [H, HEADS * 128], 0],
          ["blk.1.attn_q_norm.weight", [128], 0],
          ["blk.1.attn_k_norm.weight", [128], 0]]  # fmt: skip
    return {"metadata": meta, "tensors": t, "generator": {"seed": 6, "stdev": 0.3}}


NAMES = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
         "attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
         "ssm_beta": "linear_attn.in_proj_b", "ssm_alpha": "linear_attn.in_proj_a",
         "ssm_out": "linear_attn.out_proj", "ssm_norm": "linear_attn.norm",
         "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}  # fmt: skip
# zero-centred RMSNorms: llama.cpp's converter stores 1 + w
PLUS_ONE = ("attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm")


@pytest.mark.parametrize("chunk", (0, 16), ids=("recurrent", "chunked16"))
def test_qwen35_equals_transformers(tmp_path: Path, chunk: int) -> None:
    spec = _spec()
    values = tensor_values(spec)
    values["blk.0.ssm_a"] = -np.abs(values["blk.0.ssm_a"]) - 0.1  # -exp(A_log): negative
    ours = ours_logits(tmp_path, A, spec, values, chunk)
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=V, hidden_size=H, intermediate_size=FF, num_hidden_layers=2,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=128,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=S,
        linear_value_head_dim=S, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        layer_types=["linear_attention", "full_attention"], max_position_embeddings=256,
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "rope_type": "default"},
        tie_word_embeddings=False,
    )  # fmt: skip
    sd = {"model.embed_tokens.weight": as_tensor(values["token_embd.weight"]),
          "model.norm.weight": as_tensor(values["output_norm.weight"] - 1.0),
          "lm_head.weight": as_tensor(values["output.weight"])}  # fmt: skip
    for name, v in values.items():
        if not name.startswith("blk."):
            continue
        _, i, rest = name.split(".", 2)
        stem = rest.removesuffix(".weight").removesuffix(".bias")
        pre = f"model.layers.{i}."
        w = as_tensor(v)
        if stem == "ssm_a":
            sd[pre + "linear_attn.A_log"] = torch.log(-w)
        elif stem == "ssm_dt":
            sd[pre + "linear_attn.dt_bias"] = w
        elif stem == "ssm_conv1d":
            sd[pre + "linear_attn.conv1d.weight"] = w.unsqueeze(1)  # [C, 1, K]
        else:
            sd[pre + NAMES[stem] + ".weight"] = w - 1.0 if stem in PLUS_ONE else w
    theirs = hf_prompt_logits(qwen3_5.Qwen3_5ForCausalLM(cfg).float(), sd)
    assert len(PROMPT) > 16  # several blocks of 4
    compare(ours, theirs)
