"""Random-weights GGUF models with the real layer shapes of three MoE models, for the
architecture speed bench (`bench/arch_speed.py`, issue 27 item 5).

`python -m bench.synth_archs [qwen3moe|gpt-oss|deepseek2|all] [--layers N] [--vocab N]
[--check]` prints the paths, building what is missing (`bench.synth`'s writer and
llama-quantize, one tensor in memory at a time, F16 then Q4_K_M; cached in
`$LORASERVE_SYNTH_CACHE`, default `~/.cache/loraserve/synth`, by arch, layers and vocab).

Shapes are the public `config.json` values of Qwen3-30B-A3B (`qwen3moe`), gpt-oss-20b
(`gpt-oss`: alternating 128-token sliding window, attention sinks, biases, YaRN 32x) and
DeepSeek-V2-Lite (`deepseek2`: MLA without a query compression, kv rank 512, one leading
dense layer, 64 routed + 2 shared experts, YaRN 40x), with fewer layers (default 4) so that
each Q4_K_M file is 1.5-3.5 GB. The tokenizer is llama.cpp's `test` vocabulary (no
tokenizer of these models is on the machine) with the real vocabulary size, so the
embedding and output layer cost what they do in the real models. Tensor names and metadata
keys are those of llama.cpp's writers (`tests/data/archs/<arch>.json` lists them).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.synth import SCALE, quantize, synth_dir

FORMAT = 2  # bump when the generator changes, so cached files are rebuilt
POOL = 1 << 24  # random F16 values every matrix is cut from (fast on a loaded machine)


@dataclass(frozen=True)
class ArchShape:
    """The hyper-parameters of one real model, by llama.cpp's GGUF key suffixes."""

    arch: str
    label: str
    hidden: int
    layers: int
    vocab: int
    keys: dict[str, Any] = field(default_factory=dict)


SHAPES = {
    "qwen3moe": ArchShape("qwen3moe", "Qwen3-30B-A3B", 2048, 48, 151936, {
        "context_length": 40960, "feed_forward_length": 6144,
        "attention.head_count": 32, "attention.head_count_kv": 4,
        "attention.key_length": 128, "attention.value_length": 128,
        "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6,
        "rope.dimension_count": 128, "expert_count": 128, "expert_used_count": 8,
        "expert_feed_forward_length": 768,
    }),
    "gpt-oss": ArchShape("gpt-oss", "gpt-oss-20b", 2880, 24, 201088, {
        "context_length": 131072, "feed_forward_length": 2880,
        "attention.head_count": 64, "attention.head_count_kv": 8,
        "attention.key_length": 64, "attention.value_length": 64,
        "attention.layer_norm_rms_epsilon": 1e-5, "attention.sliding_window": 128,
        "rope.freq_base": 150000.0, "rope.dimension_count": 64, "rope.scaling.type": "yarn",
        "rope.scaling.factor": 32.0, "rope.scaling.original_context_length": 4096,
        "expert_count": 32, "expert_used_count": 4, "expert_feed_forward_length": 2880,
    }),
    "deepseek2": ArchShape("deepseek2", "DeepSeek-V2-Lite", 2048, 27, 102400, {
        "context_length": 163840, "feed_forward_length": 10944,
        "leading_dense_block_count": 1, "attention.head_count": 16,
        "attention.head_count_kv": 1, "attention.key_length": 576,
        "attention.value_length": 512, "attention.key_length_mla": 192,
        "attention.value_length_mla": 128, "attention.q_lora_rank": 0,
        "attention.kv_lora_rank": 512, "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.freq_base": 10000.0, "rope.dimension_count": 64, "rope.scaling.type": "yarn",
        "rope.scaling.factor": 40.0, "rope.scaling.original_context_length": 4096,
        "rope.scaling.yarn_log_multiplier": 0.0707, "expert_count": 64,
        "expert_used_count": 6, "expert_shared_count": 2, "expert_feed_forward_length": 1408,
        "expert_weights_scale": 1.0, "expert_weights_norm": False, "expert_gating_func": 1,
    }),
}  # fmt: skip


def synth_path(arch: str, layers: int, vocab: int, qtype: str = "Q4_K_M") -> Path:
    """Where the quantized random model of `arch` with `layers` layers is cached."""
    return synth_dir() / f"{arch}-L{layers}-V{vocab}-random-v{FORMAT}-{qtype}.gguf"


def _attn(s: ArchShape, b: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of one layer's attention (norm included)."""
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


def _ffn(s: ArchShape, b: str, i: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of one layer's feed-forward (its pre-norm included)."""
    h, k = s.hidden, s.keys
    norm = "post_attention_norm" if s.arch == "gpt-oss" else "ffn_norm"
    out: list[tuple[str, tuple[int, ...]]] = [(b + norm + ".weight", (h,))]
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


def tensor_specs(s: ArchShape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor, as llama.cpp names them (untied output)."""
    specs = [("token_embd.weight", (s.vocab, s.hidden)), ("output_norm.weight", (s.hidden,)),
             ("output.weight", (s.vocab, s.hidden))]  # fmt: skip
    for i in range(s.layers):
        specs += _attn(s, f"blk.{i}.") + _ffn(s, f"blk.{i}.", i)
    return specs


def metadata(s: ArchShape) -> dict[str, tuple[Any, Any]]:
    """Every metadata key as key -> (value, GGUF type), the `test` vocabulary included."""
    from gguf import GGUFValueType as T

    def typed(v: Any) -> tuple[Any, Any]:
        if isinstance(v, bool):
            return v, T.BOOL
        if isinstance(v, int):
            return v, T.UINT32
        return (v, T.FLOAT32) if isinstance(v, float) else (v, T.STRING)

    a = s.arch
    out = {"general.name": (f"{s.label} shapes, {s.layers} layers, random weights", T.STRING),
           "general.file_type": (1, T.UINT32), f"{a}.embedding_length": (s.hidden, T.UINT32),
           f"{a}.block_count": (s.layers, T.UINT32), f"{a}.vocab_size": (s.vocab, T.UINT32),
           "tokenizer.ggml.model": ("test", T.STRING)}  # fmt: skip
    out.update({f"{a}.{key}": typed(v) for key, v in s.keys.items()})
    return out


def _pool(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (SCALE * rng.standard_normal(2 * POOL, dtype=np.float32)).astype(np.float16)


def _tensor(pool: np.ndarray, rng: np.random.Generator, shp: tuple[int, ...]) -> np.ndarray:
    """Random values of `shp`: vectors 1 + N(0, SCALE^2) (norms) in F32, matrices F16 cut
    from the shared pool at random offsets (every 64K-value run its own offset)."""
    if len(shp) == 1:
        return (1.0 + SCALE * rng.standard_normal(shp, dtype=np.float32)).astype(np.float32)
    flat, run = np.empty(int(np.prod(shp)), np.float16), 1 << 16
    for lo in range(0, flat.size, run):
        n = min(run, flat.size - lo)
        off = int(rng.integers(0, POOL))
        flat[lo : lo + n] = pool[off : off + n]
    return flat.reshape(shp)


def write_f16(path: Path, s: ArchShape, seed: int = 27) -> Path:
    """Write the random F16 GGUF of `s` (vectors and biases F32) one tensor at a time."""
    import gguf

    specs = tensor_specs(s)
    w = gguf.GGUFWriter(path, s.arch)
    for key, (value, vtype) in metadata(s).items():
        w.add_key_value(key, value, vtype)
    tokens = [f"tok_{i}" for i in range(s.vocab)]
    w.add_key_value("tokenizer.ggml.tokens", tokens, gguf.GGUFValueType.ARRAY,
                    gguf.GGUFValueType.STRING)  # fmt: skip
    w.add_key_value("tokenizer.ggml.token_type", [1] * s.vocab, gguf.GGUFValueType.ARRAY,
                    gguf.GGUFValueType.INT32)  # fmt: skip
    for name, shp in specs:
        f32 = len(shp) == 1 or name.endswith(".bias") or "ffn_gate_inp" in name  # as convert
        dtype = np.dtype(np.float32 if f32 else np.float16)
        w.add_tensor_info(name, shp, dtype, int(np.prod(shp)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool, rng = _pool(seed), np.random.default_rng(seed + 1)
    for name, shp in specs:
        arr = _tensor(pool, rng, shp)
        if name.endswith(".bias"):  # biases near 0, not 1
            arr = (arr.astype(np.float32) - (1.0 if arr.ndim == 1 else 0.0)).astype(np.float32)
        elif "ffn_gate_inp" in name:  # the router, F32 as convert_hf_to_gguf writes it
            arr = arr.astype(np.float32)
        w.write_tensor_data(arr)
    w.close()
    return path


def shape_of(arch: str, layers: int | None = None, vocab: int | None = None) -> ArchShape:
    """`SHAPES[arch]` with `layers` / `vocab` in place of the real ones where given."""
    s = SHAPES[arch]
    return ArchShape(s.arch, s.label, s.hidden, layers or s.layers, vocab or s.vocab, s.keys)


def synth_model(arch: str, layers: int = 4, vocab: int | None = None) -> Path:
    """The cached random model of `arch` (`layers` layers), built first if missing."""
    s = shape_of(arch, layers, vocab)
    target = synth_path(arch, s.layers, s.vocab)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    f16 = target.with_name(f".{target.stem}.{os.getpid()}.f16.gguf")
    part = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        print(f"synth_archs: writing {f16}", file=sys.stderr, flush=True)
        write_f16(f16, s)
        print(f"synth_archs: quantizing {arch} to Q4_K_M", file=sys.stderr, flush=True)
        quantize(f16, part, "Q4_K_M")
        os.replace(part, target)
    finally:
        f16.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.synth_archs [ARCH|all] [--layers N] [--vocab N] [--check]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.synth_archs", description=__doc__)
    ap.add_argument("which", nargs="?", default="all", choices=[*SHAPES, "all"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=None, help="default: the real vocabulary")
    ap.add_argument("--check", action="store_true", help="start llama-server on each file")
    args = ap.parse_args(argv)
    for arch in list(SHAPES) if args.which == "all" else [args.which]:
        path = synth_model(arch, args.layers, args.vocab)
        print(path, flush=True)
        if args.check:
            from bench.synth import check_loads

            print(f"  {check_loads(path)}", flush=True)


if __name__ == "__main__":
    main()
