"""The recurrent layer kinds against transformers float32, on the same random weights.

Tiny models of llama.cpp's `test-llama-archs` shapes (n_embd 256, 2 layers: attention at layer
0, the recurrent kind at layer 1, the `test` vocabulary) are written by loraserve's GGUF writer
from a seed; the same values, renamed and reshaped as llama.cpp's converter maps them, load
into transformers' `Lfm2ForCausalLM` (short convolution) and `GraniteMoeHybridForCausalLM`
(Mamba-2, its torch path: the chunked scan). loraserve's float32 logits of every position of
a prompt longer than several blocks must match (log-probabilities within 1e-3, the same argmax
wherever the top two differ by more than 1e-3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.arch_models import tensor_values
from tests.unit.model.recurrent_hf_util import (
    as_tensor,
    compare,
    hf_prompt_logits,
    ours_logits,
)

transformers = pytest.importorskip("transformers")

H, FF, V, L = 256, 384, 128, 2


def _meta(arch: str, extra: list[list[Any]]) -> list[list[Any]]:
    return [["general.architecture", "STRING", arch], ["general.name", "STRING", "n/a"],
            [f"{arch}.vocab_size", "UINT32", V], [f"{arch}.context_length", "UINT32", 256],
            [f"{arch}.embedding_length", "UINT32", H], [f"{arch}.block_count", "UINT32", L],
            [f"{arch}.feed_forward_length", "UINT32", FF],
            [f"{arch}.attention.head_count", "ARRAY:UINT32", [2, 0]],
            [f"{arch}.attention.head_count_kv", "ARRAY:UINT32", [2, 0]],
            [f"{arch}.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-5],
            [f"{arch}.rope.freq_base", "FLOAT32", 10000.0],
            ["tokenizer.ggml.model", "STRING", "test"],
            ["tokenizer.ggml.tokens", "ARRAY:STRING", [f"tok_{i}" for i in range(V)]],
            *extra]  # fmt: skip


def _common(norm: str) -> list[list[Any]]:
    t = [["token_embd.weight", [V, H], 0], [norm, [H], 0]]
    for i in range(L):
        p = f"blk.{i}."
        t += [[p + "attn_norm.weight", [H], 0], [p + "ffn_norm.weight", [H], 0],
              [p + "ffn_gate.weight", [FF, H], 0], [p + "ffn_up.weight", [FF, H], 0],
              [p + "ffn_down.weight", [H, FF], 0]]  # fmt: skip
    t += [["blk.0." + n + ".weight", [H, H], 0]
          for n in ("attn_q", "attn_k", "attn_v", "attn_output")]  # fmt: skip
    return t


def test_lfm2_short_convolution_equals_transformers(tmp_path: Path) -> None:
    t = _common("token_embd_norm.weight") + [
        ["blk.0.attn_q_norm.weight", [128], 0], ["blk.0.attn_k_norm.weight", [128], 0],
        ["blk.1.shortconv.in_proj.weight", [3 * H, H], 0],
        ["blk.1.shortconv.out_proj.weight", [H, H], 0], ["blk.1.shortconv.conv.weight", [H, 3], 0],
    ]  # fmt: skip
    spec = {"metadata": _meta("lfm2", [["lfm2.shortconv.l_cache", "UINT32", 3]]), "tensors": t,
            "generator": {"seed": 3, "stdev": 0.3}}  # fmt: skip
    values = tensor_values(spec)
    ours = ours_logits(tmp_path, "lfm2", spec, values)
    cfg = transformers.Lfm2Config(
        vocab_size=V, hidden_size=H, intermediate_size=FF, num_hidden_layers=L,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, norm_eps=1e-5,
        layer_types=["full_attention", "conv"], conv_L_cache=3, conv_bias=False,
        block_auto_adjust_ff_dim=False, tie_word_embeddings=True,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
    )  # fmt: skip
    sd = {"model.embed_tokens.weight": as_tensor(values["token_embd.weight"]),
          "model.embedding_norm.weight": as_tensor(values["token_embd_norm.weight"])}  # fmt: skip
    names = {"attn_norm": "operator_norm", "ffn_norm": "ffn_norm", "ffn_gate": "feed_forward.w1",
             "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.out_proj",
             "attn_q_norm": "self_attn.q_layernorm", "attn_k_norm": "self_attn.k_layernorm",
             "shortconv.in_proj": "conv.in_proj", "shortconv.out_proj": "conv.out_proj",
             "shortconv.conv": "conv.conv"}  # fmt: skip
    for name, v in values.items():
        if name.startswith("blk."):
            _, i, rest = name.split(".", 2)
            stem = rest.removesuffix(".weight")
            w = as_tensor(v)
            if stem == "shortconv.conv":
                w = w.unsqueeze(1)  # Conv1d [C, 1, L]
            sd[f"model.layers.{i}.{names[stem]}.weight"] = w
    theirs = hf_prompt_logits(transformers.Lfm2ForCausalLM(cfg).float(), sd)
    compare(ours, theirs)


@pytest.mark.parametrize("chunk", (0, 16), ids=("recurrent", "chunked16"))
def test_granitehybrid_mamba2_equals_transformers(tmp_path: Path, chunk: int) -> None:
    di, n, nh, g, k = 2 * H, 16, 4, 2, 4
    conv_dim = di + 2 * g * n
    t = _common("output_norm.weight") + [
        ["blk.1.ssm_in.weight", [2 * di + 2 * g * n + nh, H], 0],
        ["blk.1.ssm_out.weight", [H, di], 0], ["blk.1.ssm_conv1d.weight", [conv_dim, k], 0],
        ["blk.1.ssm_conv1d.bias", [conv_dim], 0], ["blk.1.ssm_dt.bias", [nh], 0],
        ["blk.1.ssm_a", [nh, 1], 0], ["blk.1.ssm_d", [nh, 1], 0],
        ["blk.1.ssm_norm.weight", [g, di // g], 0],
    ]  # fmt: skip
    a = "granitehybrid"
    extra = [[f"{a}.ssm.conv_kernel", "UINT32", k], [f"{a}.ssm.inner_size", "UINT32", di],
             [f"{a}.ssm.state_size", "UINT32", n], [f"{a}.ssm.time_step_rank", "UINT32", nh],
             [f"{a}.ssm.group_count", "UINT32", g], [f"{a}.logit_scale", "FLOAT32", 2.0],
             [f"{a}.residual_scale", "FLOAT32", 0.5], [f"{a}.embedding_scale", "FLOAT32", 3.0],
             [f"{a}.rope.scaling.finetuned", "BOOL", False]]  # fmt: skip
    spec = {"metadata": _meta(a, extra), "tensors": t, "generator": {"seed": 4, "stdev": 0.3}}
    values = tensor_values(spec)
    values["blk.1.ssm_a"] = -np.abs(values["blk.1.ssm_a"]) - 0.1  # -exp(A_log): negative
    ours = ours_logits(tmp_path, a, spec, values, chunk)
    cfg = transformers.GraniteMoeHybridConfig(
        vocab_size=V, hidden_size=H, intermediate_size=FF, shared_intermediate_size=FF,
        num_hidden_layers=L, num_attention_heads=2, num_key_value_heads=2,
        max_position_embeddings=256, rms_norm_eps=1e-5, num_local_experts=0,
        layer_types=["attention", "mamba"], mamba_n_heads=nh, mamba_n_groups=g,
        mamba_d_state=n, mamba_d_head=di // nh, mamba_d_conv=k, mamba_expand=2,
        mamba_chunk_size=8, mamba_conv_bias=True, mamba_proj_bias=False,
        embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.0,
        attention_multiplier=1.0 / (H // 2) ** 0.5, position_embedding_type=None,
        tie_word_embeddings=True,
    )  # fmt: skip
    sd = {"model.embed_tokens.weight": as_tensor(values["token_embd.weight"]),
          "model.norm.weight": as_tensor(values["output_norm.weight"])}  # fmt: skip
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "ffn_down": "shared_mlp.output_linear", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ssm_in": "mamba.in_proj",
             "ssm_out": "mamba.out_proj", "ssm_conv1d": "mamba.conv1d",
             "ssm_dt": "mamba.dt_bias", "ssm_norm": "mamba.norm"}  # fmt: skip
    for i in range(L):
        p = f"blk.{i}."
        gate_up = np.concatenate([values[p + "ffn_gate.weight"], values[p + "ffn_up.weight"]])
        sd[f"model.layers.{i}.shared_mlp.input_linear.weight"] = as_tensor(gate_up)
    for name, v in values.items():
        if not name.startswith("blk.") or ".ffn_gate." in name or ".ffn_up." in name:
            continue
        _, i, rest = name.split(".", 2)
        stem, _, kind = rest.partition(".")
        w = as_tensor(v)
        pre = f"model.layers.{i}."
        if stem == "ssm_a":
            sd[pre + "mamba.A_log"] = torch.log(-w.reshape(-1))
        elif stem == "ssm_d":
            sd[pre + "mamba.D"] = w.reshape(-1)
        elif stem == "ssm_dt":
            sd[pre + "mamba.dt_bias"] = w
        elif stem == "ssm_conv1d" and kind == "weight":
            sd[pre + "mamba.conv1d.weight"] = w.unsqueeze(1)  # [C, 1, K]
        elif stem == "ssm_norm":
            sd[pre + "mamba.norm.weight"] = w.reshape(-1)
        else:
            sd[pre + names[stem] + "." + kind] = w
    theirs = hf_prompt_logits(transformers.GraniteMoeHybridForCausalLM(cfg).float(), sd)
    compare(ours, theirs)
