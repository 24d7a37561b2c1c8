"""Real-model layer shapes of the hybrid / state-space architectures beyond `qwen35` and
`granitehybrid`, for `bench.hybrid_synth` (issue 28's model list).

Each arch is a `Hybrid`: the real model's sizes, a layer-kind pattern (one character per
layer, repeated to the layer count, so that fewer layers keep the real ratio of kinds) and
its `<arch>.` metadata keys; the tensor table is derived from the keys as llama.cpp's loaders
derive it (`src/models/<arch>.cpp`), so the same code applied to the metadata of
`tests/data/archs/<arch>.json` (llama.cpp's `test-llama-archs` templates) gives the recorded
tensor table (`tests/test_bench_hybrid_shapes.py`). Shapes are numpy order (rows, columns).

Real models (public `config.json` values):

- `lfm2`: LFM2-1.2B: hidden 2048, FFN 8192 (the auto-adjusted 12288), 16 layers of which 6
  attention (32 query / 8 KV heads of 64, q/k norms, rope 1e6) and 10 short convolutions
  (kernel 3), tied output, vocabulary 65536. Pattern `ccAccAcA` (5 conv : 3 attention).
- `nemotron_h`: NVIDIA-Nemotron-Nano-9B-v2: hidden 4480, 56 layers (27 Mamba-2, 25 relu²
  FFN 15680, 4 attention 40 / 8 heads of 128, no rope), Mamba-2 128 heads of 80 (inner
  10240), 8 groups of state 128, conv 4, untied, vocabulary 131072. Pattern
  `M-M-M*-M-M-M-M` (7 : 6 : 1, the real 27 : 25 : 4).
- `falcon-h1`: Falcon-H1-1.5B: hidden 2048, 24 layers each with attention (8 / 2 heads of
  128, rope 1e11) beside Mamba-2 (48 heads of 64, inner 3072, one group of state 256, conv
  4) and a SwiGLU FFN of 4096 (the FFN size that gives the model's 1.5B parameters), untied,
  vocabulary 65537.
- `mamba2`: mamba2-1.3b: hidden 2048, 48 layers, inner 4096 (64 heads of 64), one group of
  state 128, conv 4, tied, vocabulary 50288.
- `qwen35moe`: Qwen3.5-35B-A3B: hidden 2048, 40 layers (3 gated delta-net : 1 gated
  attention 16 / 2 heads of 256, rope on 64 dims), delta-net 16 key / 32 value heads of 128,
  256 routed experts of 512 (8 used) plus a gated shared expert of 512, untied, vocabulary
  248320.
- `lfm2moe`: LFM2-8B-A1B: LFM2's layers (hidden 2048, 32 / 8 heads of 64, conv kernel 3) with
  18 conv : 6 attention, two leading dense FFNs of 7168, then 32 sigmoid-routed experts of
  1792 (4 used, selection bias), tied output, vocabulary 65536. Pattern `ccAc`.
- `qwen3next`: Qwen3-Next-80B-A3B: as `qwen35moe` (48 layers, 3 : 1) but 512 experts (10
  used), the delta-net's beta and alpha in one `ssm_ba`, plain rope on 64 dims, vocabulary
  151936.
- `nemotron_h_moe`: NVIDIA-Nemotron-3-Nano-30B-A3B: hidden 2688, 52 layers (23 Mamba-2 : 23
  MoE : 6 attention 32 / 2 heads of 128), Mamba-2 64 heads of 64, 8 groups of state 128, 128
  relu² experts of 1856 (6 used, sigmoid with selection bias, weights normed and x2.5) plus a
  shared expert of 3712, untied, vocabulary 131072. Pattern `MEMEM*EME` (4 : 4 : 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Spec = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class Hybrid:
    """One real model's sizes and layer layout."""

    label: str
    hidden: int
    real_layers: int
    vocab: int
    default_layers: int
    pattern: str  # one char per layer kind, repeated to the layer count
    tied: bool
    keys: dict[str, Any] = field(default_factory=dict)

    def kinds(self, layers: int) -> str:
        """The kind of each of `layers` layers."""
        return (self.pattern * (layers // len(self.pattern) + 1))[:layers]


# fmt: off
SHAPES: dict[str, Hybrid] = {
    "lfm2": Hybrid("LFM2-1.2B", 2048, 16, 65536, 8, "ccAccAcA", True, {
        "context_length": 128000, "feed_forward_length": 8192, "attention.head_count": 32,
        "attention.head_count_kv": 8, "attention.layer_norm_rms_epsilon": 1e-5,
        "rope.freq_base": 1e6, "shortconv.l_cache": 3}),
    "nemotron_h": Hybrid("NVIDIA-Nemotron-Nano-9B-v2", 4480, 56, 131072, 14, "M-M-M*-M-M-M-M",
                         False, {
        "context_length": 131072, "feed_forward_length": 15680, "attention.head_count": 40,
        "attention.head_count_kv": 8, "attention.key_length": 128,
        "attention.value_length": 128, "attention.layer_norm_epsilon": 1e-5,
        "attention.layer_norm_rms_epsilon": 1e-5, "ssm.conv_kernel": 4,
        "ssm.inner_size": 10240, "ssm.state_size": 128, "ssm.time_step_rank": 128,
        "ssm.group_count": 8}),
    "falcon-h1": Hybrid("Falcon-H1-1.5B", 2048, 24, 65537, 6, "H", False, {
        "context_length": 131072, "feed_forward_length": 4096, "attention.head_count": 8,
        "attention.head_count_kv": 2, "attention.key_length": 128,
        "attention.value_length": 128, "attention.layer_norm_rms_epsilon": 1e-5,
        "rope.freq_base": 1e11, "rope.dimension_count": 128, "ssm.conv_kernel": 4,
        "ssm.inner_size": 3072, "ssm.state_size": 256, "ssm.time_step_rank": 48,
        "ssm.group_count": 1}),
    "mamba2": Hybrid("mamba2-1.3b", 2048, 48, 50288, 12, "M", True, {
        "context_length": 1048576, "feed_forward_length": 0, "attention.head_count": 0,
        "attention.layer_norm_rms_epsilon": 1e-5,
        "ssm.conv_kernel": 4, "ssm.inner_size": 4096, "ssm.state_size": 128,
        "ssm.time_step_rank": 64, "ssm.group_count": 1}),
    "qwen35moe": Hybrid("Qwen3.5-35B-A3B", 2048, 40, 248320, 4, "dddA", False, {
        "context_length": 262144, "attention.head_count": 16, "attention.head_count_kv": 2,
        "attention.key_length": 256, "attention.value_length": 256,
        "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e7,
        "rope.dimension_count": 64, "rope.dimension_sections": [11, 11, 10, 0],
        "full_attention_interval": 4, "ssm.conv_kernel": 4, "ssm.inner_size": 4096,
        "ssm.state_size": 128, "ssm.time_step_rank": 32, "ssm.group_count": 16,
        "expert_count": 256, "expert_used_count": 8, "expert_feed_forward_length": 512,
        "expert_shared_feed_forward_length": 512,
        "feed_forward_length": 512}),  # optional to llama.cpp, required by loraserve
    "lfm2moe": Hybrid("LFM2-8B-A1B", 2048, 24, 65536, 8, "ccAc", True, {
        "context_length": 128000, "feed_forward_length": 7168, "leading_dense_block_count": 2,
        "attention.head_count": 32, "attention.head_count_kv": 8,
        "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 1e6,
        "shortconv.l_cache": 3, "expert_count": 32, "expert_used_count": 4,
        "expert_feed_forward_length": 1792, "expert_gating_func": 2,
        "expert_weights_norm": True}),
    "qwen3next": Hybrid("Qwen3-Next-80B-A3B", 2048, 48, 151936, 4, "dddA", False, {
        "context_length": 262144, "feed_forward_length": 5120, "attention.head_count": 16,
        "attention.head_count_kv": 2, "attention.key_length": 256,
        "attention.value_length": 256, "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.freq_base": 1e7, "rope.dimension_count": 64, "full_attention_interval": 4,
        "ssm.conv_kernel": 4, "ssm.inner_size": 4096, "ssm.state_size": 128,
        "ssm.time_step_rank": 32, "ssm.group_count": 16, "expert_count": 512,
        "expert_used_count": 10, "expert_feed_forward_length": 512,
        "expert_shared_feed_forward_length": 512}),
    "nemotron_h_moe": Hybrid("NVIDIA-Nemotron-3-Nano-30B-A3B", 2688, 52, 131072, 9, "MEMEM*EME",
                             False, {
        "context_length": 262144, "feed_forward_length": 1856, "attention.head_count": 32,
        "attention.head_count_kv": 2, "attention.key_length": 128,
        "attention.value_length": 128, "attention.layer_norm_epsilon": 1e-5,
        "attention.layer_norm_rms_epsilon": 1e-5, "ssm.conv_kernel": 4,
        "ssm.inner_size": 4096, "ssm.state_size": 128, "ssm.time_step_rank": 64,
        "ssm.group_count": 8, "expert_count": 128, "expert_used_count": 6,
        "expert_feed_forward_length": 1856, "expert_shared_feed_forward_length": 3712,
        "expert_shared_count": 1, "expert_weights_scale": 2.5, "expert_weights_norm": True}),
}
# fmt: on
# attention kinds, where mixed
ATTN = {
    "lfm2": "A",
    "lfm2moe": "A",
    "nemotron_h": "*",
    "nemotron_h_moe": "*",
    "qwen35moe": "A",
    "qwen3next": "A",
}  # fmt: skip


def keys(arch: str, layers: int, shape: Hybrid | None = None) -> dict[str, Any]:
    """The `<arch>.` metadata keys beyond embedding_length/block_count/vocab_size: per-layer
    arrays where llama.cpp tells the layer kinds apart by them (KV heads 0 on recurrent
    layers; `nemotron_h`: FFN size 0 on all but the FFN layers)."""
    s = shape or SHAPES[arch]
    out, kinds = dict(s.keys), s.kinds(layers)
    if arch in ("lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe"):
        kv = out["attention.head_count_kv"]
        out["attention.head_count_kv"] = [kv if k == ATTN[arch] else 0 for k in kinds]
    if arch.startswith("nemotron_h"):  # FFN or MoE layers: "-" / "E"
        ff = out["feed_forward_length"]
        out["feed_forward_length"] = [ff if k in "-E" else 0 for k in kinds]
    return out


def _mamba2(b: str, h: int, k: dict[str, Any]) -> list[Spec]:
    """A Mamba-2 mixer's tensors (llama.cpp's `ssm_*`, conv bias included)."""
    inner, state, heads = k["ssm.inner_size"], k["ssm.state_size"], k["ssm.time_step_rank"]
    groups, conv = k["ssm.group_count"], k["ssm.inner_size"] + 2 * k["ssm.group_count"] * state
    return [(b + "ssm_in.weight", (inner + conv + heads, h)),
            (b + "ssm_conv1d.weight", (conv, k["ssm.conv_kernel"])),
            (b + "ssm_conv1d.bias", (conv,)), (b + "ssm_dt.bias", (heads,)),
            (b + "ssm_a", (heads, 1)), (b + "ssm_d", (heads, 1)),
            (b + "ssm_norm.weight", (groups, inner // groups)),
            (b + "ssm_out.weight", (h, inner))]  # fmt: skip


def _attn(b: str, h: int, k: dict[str, Any], q_rows: int = 0, gate: int = 1) -> list[Spec]:
    """q, k, v, o: query rows `q_rows` (default heads x head size, times `gate`)."""
    heads, dim = (
        k["attention.head_count"],
        k.get("attention.key_length", h // k["attention.head_count"]),
    )
    kv, q = k["attention.head_count_kv"], q_rows or heads * dim
    return [(b + "attn_q.weight", (gate * q, h)), (b + "attn_k.weight", (kv * dim, h)),
            (b + "attn_v.weight", (kv * dim, h)),
            (b + "attn_output.weight", (h, q))]  # fmt: skip


def _ffn(b: str, h: int, f: int, gate: bool = True, tag: str = "") -> list[Spec]:
    out = [(f"{b}ffn_up{tag}.weight", (f, h)), (f"{b}ffn_down{tag}.weight", (h, f))]
    return [(f"{b}ffn_gate{tag}.weight", (f, h)), *out] if gate else out


def _layer(arch: str, kind: str, i: int, h: int, k: dict[str, Any]) -> list[Spec]:
    """Layer `i`'s tensors for its kind, from the scalar keys `k`."""
    dim, b = k.get("attention.key_length", 0), f"blk.{i}."
    if arch in ("lfm2", "lfm2moe"):
        ff = _ffn(b, h, k["feed_forward_length"])
        if arch == "lfm2moe" and i >= k["leading_dense_block_count"]:
            e, f = k["expert_count"], k["expert_feed_forward_length"]
            ff = [(b + "ffn_gate_inp.weight", (e, h)), (b + "ffn_gate_exps.weight", (e, f, h)),
                  (b + "ffn_up_exps.weight", (e, f, h)), (b + "ffn_down_exps.weight", (e, h, f)),
                  (b + "exp_probs_b.bias", (e,))]  # fmt: skip
        out = [(b + "attn_norm.weight", (h,)), (b + "ffn_norm.weight", (h,)), *ff]
        if kind == "A":
            dim = dim or h // k["attention.head_count"]
            return [*out, (b + "attn_q_norm.weight", (dim,)), (b + "attn_k_norm.weight", (dim,)),
                    *_attn(b, h, k, q_rows=h)]  # fmt: skip
        return [*out, (b + "shortconv.in_proj.weight", (3 * h, h)),
                (b + "shortconv.conv.weight", (h, k["shortconv.l_cache"])),
                (b + "shortconv.out_proj.weight", (h, h))]  # fmt: skip
    if arch.startswith("nemotron_h"):
        out = [(b + "attn_norm.weight", (h,))]
        if kind == "E":  # relu² experts without a gate, sigmoid routing, a shared expert
            e, f = k["expert_count"], k["expert_feed_forward_length"]
            return out + [
                (b + "ffn_gate_inp.weight", (e, h)),
                (b + "exp_probs_b.bias", (e,)),
                (b + "ffn_up_exps.weight", (e, f, h)),
                (b + "ffn_down_exps.weight", (e, h, f)),
                *_ffn(b, h, k["expert_shared_feed_forward_length"], False, "_shexp"),
            ]
        if kind == "M":
            return out + _mamba2(b, h, k)
        if kind == "*":
            return out + _attn(b, h, k)
        return out + _ffn(b, h, k["feed_forward_length"], gate=False)
    if arch == "falcon-h1":  # llama.cpp names the FFN norm without ".weight"
        return [(b + "attn_norm.weight", (h,)), (b + "ffn_norm", (h,)), *_attn(b, h, k),
                *_mamba2(b, h, k), *_ffn(b, h, k["feed_forward_length"])]  # fmt: skip
    if arch == "mamba2":
        return [(b + "attn_norm.weight", (h,)), *_mamba2(b, h, k)]
    # qwen35moe, qwen3next: gated attention or gated delta-net, then the routed + shared experts
    out = [(b + "attn_norm.weight", (h,)), (b + "post_attention_norm.weight", (h,))]
    if kind == "A":
        out += [*_attn(b, h, k, gate=2), (b + "attn_q_norm.weight", (dim,)),
                (b + "attn_k_norm.weight", (dim,))]  # fmt: skip
    else:  # key heads: group_count x state_size; value heads: time_step_rank, inner_size in all
        inner, tsr = k["ssm.inner_size"], k["ssm.time_step_rank"]
        conv = 2 * k["ssm.group_count"] * k["ssm.state_size"] + inner
        out += [(b + "attn_qkv.weight", (conv, h)), (b + "attn_gate.weight", (inner, h)),
                (b + "ssm_conv1d.weight", (conv, k["ssm.conv_kernel"])),
                (b + "ssm_dt.bias", (tsr,)), (b + "ssm_a", (tsr,)),
                *([(b + "ssm_ba.weight", (2 * tsr, h))] if arch == "qwen3next" else
                  [(b + "ssm_beta.weight", (tsr, h)), (b + "ssm_alpha.weight", (tsr, h))]),
                (b + "ssm_norm.weight", (k["ssm.state_size"],)),
                (b + "ssm_out.weight", (h, inner))]  # fmt: skip
    e, f = k["expert_count"], k["expert_feed_forward_length"]
    return out + [(b + "ffn_gate_inp.weight", (e, h)), (b + "ffn_gate_exps.weight", (e, f, h)),
                  (b + "ffn_up_exps.weight", (e, f, h)), (b + "ffn_down_exps.weight", (e, h, f)),
                  (b + "ffn_gate_inp_shexp.weight", (h,)),
                  *_ffn(b, h, k["expert_shared_feed_forward_length"], tag="_shexp")]  # fmt: skip


def tensor_specs(arch: str, layers: int, vocab: int, shape: Hybrid | None = None) -> list[Spec]:
    """(name, numpy shape) of every tensor of `arch` with `layers` layers (`shape`: another
    model of the arch than the real one, e.g. a test template's sizes)."""
    s = shape or SHAPES[arch]
    h = s.hidden
    norm = "token_embd_norm.weight" if arch.startswith("lfm2") else "output_norm.weight"
    specs: list[Spec] = [("token_embd.weight", (vocab, h)), (norm, (h,))]
    if not s.tied:
        specs.append(("output.weight", (vocab, h)))
    for i, kind in enumerate(s.kinds(layers)):
        specs += _layer(arch, kind, i, h, s.keys)
    return specs
