"""Tensor names and shapes of `bench.arch_shapes`' models, as llama.cpp's loader expects them.

`tensor_specs(shape)` lists (name, numpy shape) in file order: numpy shapes are (rows, cols),
the reverse of ggml's `{ne0, ne1}` in `vendor/llama.cpp/src/models/<arch>.cpp`. Dense
families follow `ArchShape.flags` (see `bench.arch_shapes`); the MoE ones (qwen3moe,
gpt-oss, deepseek2) have their own layouts.
"""

from __future__ import annotations

from bench.arch_shapes import ArchShape

Spec = list[tuple[str, tuple[int, ...]]]


def _moe_attn(s: ArchShape, b: str) -> Spec:
    """(name, numpy shape) of one MoE model layer's attention (norm included)."""
    h, k = s.hidden, s.keys
    if s.arch == "deepseek2":  # MLA, queries uncompressed (V2-Lite), per-head k_b / v_b
        nh, rank, rope = k["attention.head_count"], k["attention.kv_lora_rank"], 64
        qk, v = k["attention.key_length_mla"], k["attention.value_length_mla"]
        return [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (nh * qk, h)),
                (b + "attn_kv_a_mqa.weight", (rank + rope, h)),
                (b + "attn_kv_a_norm.weight", (rank,)),
                (b + "attn_k_b.weight", (nh, rank, qk - rope)),
                (b + "attn_v_b.weight", (nh, v, rank)),
                (b + "attn_output.weight", (h, nh * v))]  # fmt: skip
    q = k["attention.head_count"] * k["attention.key_length"]
    kv = k["attention.head_count_kv"] * k["attention.key_length"]
    out = [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (q, h)),
           (b + "attn_k.weight", (kv, h)), (b + "attn_v.weight", (kv, h)),
           (b + "attn_output.weight", (h, q))]  # fmt: skip
    if s.arch == "qwen3moe":
        hd = k["attention.key_length"]
        out += [(b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,))]
    else:  # gpt-oss: biases and one sink logit per head
        out += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)), (b + "attn_v.bias", (kv,)),
                (b + "attn_output.bias", (h,)),
                (b + "attn_sinks.weight", (k["attention.head_count"],))]  # fmt: skip
    return out


def _moe_ffn(s: ArchShape, b: str, i: int) -> Spec:
    """(name, numpy shape) of one MoE model layer's feed-forward (its pre-norm included)."""
    h, k = s.hidden, s.keys
    norm = "post_attention_norm" if s.arch == "gpt-oss" else "ffn_norm"
    out: Spec = [(b + norm + ".weight", (h,))]
    if i < k.get("leading_dense_block_count", 0):
        f = k["feed_forward_length"]
        return out + [(b + "ffn_gate.weight", (f, h)), (b + "ffn_up.weight", (f, h)),
                      (b + "ffn_down.weight", (h, f))]  # fmt: skip
    e, f = k["expert_count"], k["expert_feed_forward_length"]
    out += [(b + "ffn_gate_inp.weight", (e, h)), (b + "ffn_gate_exps.weight", (e, f, h)),
            (b + "ffn_up_exps.weight", (e, f, h)),
            (b + "ffn_down_exps.weight", (e, h, f))]  # fmt: skip
    if s.arch == "gpt-oss":
        out += [(b + "ffn_gate_inp.bias", (e,)), (b + "ffn_gate_exps.bias", (e, f)),
                (b + "ffn_up_exps.bias", (e, f)), (b + "ffn_down_exps.bias", (e, h))]  # fmt: skip
    if k.get("expert_shared_count"):
        fs = f * k["expert_shared_count"]
        out += [(b + "ffn_gate_shexp.weight", (fs, h)), (b + "ffn_up_shexp.weight", (fs, h)),
                (b + "ffn_down_shexp.weight", (h, fs))]  # fmt: skip
    return out


def _norm(s: ArchShape, name: str) -> Spec:
    """A norm's weight (and bias under `layernorm_bias`)."""
    out: Spec = [(name + ".weight", (s.hidden,))]
    return out + [(name + ".bias", (s.hidden,))] if "layernorm_bias" in s.flags else out


def _dense_attn(s: ArchShape, b: str) -> Spec:
    """(name, numpy shape) of one dense layer's attention, norms included."""
    h, k, fl = s.hidden, s.keys, s.flags
    hd = k["attention.key_length"]
    q, kv = k["attention.head_count"] * hd, k["attention.head_count_kv"] * hd
    out: Spec = [] if "no_pre_norms" in fl else _norm(s, b + "attn_norm")
    if "fused_qkv" in fl:
        out.append((b + "attn_qkv.weight", (q + 2 * kv, h)))
    else:
        out += [(b + "attn_q.weight", (q, h)), (b + "attn_k.weight", (kv, h)),
                (b + "attn_v.weight", (kv, h))]  # fmt: skip
    if "qkv_bias" in fl:
        out += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)), (b + "attn_v.bias", (kv,))]
    if "qk_norm_head" in fl:
        out += [(b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,))]
    elif "qk_norm_all" in fl:
        out += [(b + "attn_q_norm.weight", (q,)), (b + "attn_k_norm.weight", (kv,))]
    out.append((b + "attn_output.weight", (h, q)))
    if "o_bias" in fl:
        out.append((b + "attn_output.bias", (h,)))
    if "post_norms" in fl:
        out.append((b + "post_attention_norm.weight", (h,)))
    return out


def _dense_ffn(s: ArchShape, b: str) -> Spec:
    """(name, numpy shape) of one dense layer's feed-forward, norms included."""
    h, f, fl = s.hidden, s.keys["feed_forward_length"], s.flags
    out: Spec = []
    if "seed_norms" in fl:
        out.append((b + "post_attention_norm.weight", (h,)))
    elif not fl & {"no_pre_norms", "no_ffn_norm"}:
        out += _norm(s, b + "ffn_norm")
    if "ffn_plain" in fl:  # GELU MLP with biases
        out += [(b + "ffn_up.weight", (f, h)), (b + "ffn_up.bias", (f,)),
                (b + "ffn_down.weight", (h, f)), (b + "ffn_down.bias", (h,))]  # fmt: skip
    elif "ffn_fused" in fl:
        out += [(b + "ffn_up.weight", (2 * f, h)), (b + "ffn_down.weight", (h, f))]
    else:
        out += [(b + "ffn_gate.weight", (f, h)), (b + "ffn_up.weight", (f, h)),
                (b + "ffn_down.weight", (h, f))]  # fmt: skip
    if "post_norms" in fl:
        out.append((b + "post_ffw_norm.weight", (h,)))
    return out


def _globals(s: ArchShape) -> Spec:
    """The embedding, output norm and output layer, and the rope factor vectors."""
    out: Spec = [("token_embd.weight", (s.vocab, s.hidden)), *_norm(s, "output_norm")]
    if "tied" not in s.flags:
        out.append(("output.weight", (s.vocab, s.hidden)))
    half = s.keys.get("rope.dimension_count", 0) // 2
    if "rope_freqs" in s.flags:
        out.append(("rope_freqs.weight", (half,)))
    if "rope_factors" in s.flags:
        out += [("rope_factors_long.weight", (half,)), ("rope_factors_short.weight", (half,))]
    return out


def tensor_specs(s: ArchShape) -> Spec:
    """(name, numpy shape) of every tensor of `s`, as llama.cpp names them."""
    moe = "expert_count" in s.keys
    specs = _globals(s)
    for i in range(s.layers):
        b = f"blk.{i}."
        if moe:
            specs += _moe_attn(s, b) + _moe_ffn(s, b, i)
        else:
            specs += _dense_attn(s, b) + _dense_ffn(s, b)
    return specs
