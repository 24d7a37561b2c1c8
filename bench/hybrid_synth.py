"""Random-weights GGUF models with the real layer shapes of hybrid / state-space models, for
the hybrid speed bench (`bench/hybrid_speed.py`, issue 28).

`python -m bench.hybrid_synth [ARCH|all] [--layers N] [--vocab N]` prints the
paths, building what is missing (the `gguf` package's writer one tensor at a time in F16,
then llama-quantize to Q4_K_M; cached beside `bench.synth_archs`' files by arch, layers and
vocabulary).

Shapes (public `config.json` values):

- `qwen35`: Qwen3.5-4B: hidden 2560, FFN 9216, gated attention 16 query / 4 KV heads of 256
  (rope on 64 dims, M-RoPE sections 11/11/10/0, base 1e7), gated delta-net 16 key / 32 value
  heads of 128, conv 4, a full-attention layer every 4th (3 delta-net : 1 attention), tied
  output, vocabulary 248320; 32 layers, fewer here (a multiple of 4 keeps the ratio).
- `granitehybrid`: Granite-4.0-H-1B (dense hybrid): hidden 1536, FFN 4096, attention 12 / 4
  heads of 128, Mamba-2 48 heads of 64 (inner 3072), state 128, one group, conv 4, an
  attention layer at every 10th position from the 6th (9 Mamba-2 : 1 attention), embedding x12,
  attention x1/128, residual x0.22, logits /6, tied output, vocabulary 100352; 40 layers,
  fewer here (a multiple of 10 keeps the ratio).

`lfm2`, `nemotron_h`, `falcon-h1`, `mamba2` and `qwen35moe`: see `bench/hybrid_shapes.py`.

The tokenizer is llama.cpp's `test` vocabulary with the real size. Mamba's A is drawn
negative (-exp(U(0, 2.7))), the delta-net's A likewise, dt biases near softplus^-1(0.01..0.1),
so the recurrences decay as trained ones do.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench import hybrid_shapes
from bench.synth import quantize, synth_dir
from bench.synth_archs import _pool, _tensor

FORMAT = 1  # bump when the generator changes, so cached files are rebuilt
DEFAULT_LAYERS = {"qwen35": 8, "granitehybrid": 10}
REAL = {"qwen35": ("Qwen3.5-4B", 2560, 32, 248320), "granitehybrid": ("Granite-4.0-H-1B", 1536,
        40, 100352)}  # fmt: skip
# the other archs: `bench/hybrid_shapes.py`
DEFAULT_LAYERS |= {a: s.default_layers for a, s in hybrid_shapes.SHAPES.items()}
REAL |= {a: (s.label, s.hidden, s.real_layers, s.vocab) for a, s in hybrid_shapes.SHAPES.items()}


def is_attn(arch: str, i: int) -> bool:
    """Layer `i` of `arch` is full attention (else recurrent), as the real models lay them."""
    return (i + 1) % 4 == 0 if arch == "qwen35" else i % 10 == 5


def keys(arch: str, layers: int) -> dict[str, Any]:
    """The `<arch>.` metadata keys beyond embedding_length/block_count/vocab_size."""
    if arch in hybrid_shapes.SHAPES:
        return hybrid_shapes.keys(arch, layers)
    if arch == "qwen35":
        return {"context_length": 262144, "feed_forward_length": 9216,
                "attention.head_count": 16, "attention.head_count_kv": 4,
                "attention.key_length": 256, "attention.value_length": 256,
                "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e7,
                "rope.dimension_count": 64, "rope.dimension_sections": [11, 11, 10, 0],
                "full_attention_interval": 4, "ssm.conv_kernel": 4, "ssm.inner_size": 4096,
                "ssm.state_size": 128, "ssm.time_step_rank": 32,
                "ssm.group_count": 16}  # fmt: skip
    kv = [4 if is_attn(arch, i) else 0 for i in range(layers)]
    return {"context_length": 131072, "feed_forward_length": 4096,
            "attention.head_count": 12, "attention.head_count_kv": kv,
            "attention.layer_norm_rms_epsilon": 1e-5, "attention.scale": 0.0078125,
            "embedding_scale": 12.0, "residual_scale": 0.22, "logit_scale": 6.0,
            "rope.freq_base": 10000.0, "rope.dimension_count": 128,
            "rope.scaling.finetuned": False, "ssm.conv_kernel": 4, "ssm.inner_size": 3072,
            "ssm.state_size": 128, "ssm.time_step_rank": 48,
            "ssm.group_count": 1}  # fmt: skip


def tensor_specs(arch: str, layers: int, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor, as llama.cpp's loaders name them."""
    if arch in hybrid_shapes.SHAPES:
        return hybrid_shapes.tensor_specs(arch, layers, vocab)
    h = REAL[arch][1]  # qwen35, granitehybrid: tied output
    specs: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, h)),
                                                 ("output_norm.weight", (h,))]  # fmt: skip
    for i in range(layers):
        b = f"blk.{i}."
        if arch == "qwen35":
            specs += [(b + "attn_norm.weight", (h,)), (b + "post_attention_norm.weight", (h,))]
            if is_attn(arch, i):
                specs += [(b + "attn_q.weight", (2 * 16 * 256, h)),
                          (b + "attn_k.weight", (4 * 256, h)), (b + "attn_v.weight", (4 * 256, h)),
                          (b + "attn_output.weight", (h, 16 * 256)),
                          (b + "attn_q_norm.weight", (256,)),
                          (b + "attn_k_norm.weight", (256,))]  # fmt: skip
            else:  # keys 16 x 128, values 32 x 128
                conv = 2 * 16 * 128 + 4096
                specs += [(b + "attn_qkv.weight", (conv, h)), (b + "attn_gate.weight", (4096, h)),
                          (b + "ssm_conv1d.weight", (conv, 4)), (b + "ssm_dt.bias", (32,)),
                          (b + "ssm_a", (32,)), (b + "ssm_beta.weight", (32, h)),
                          (b + "ssm_alpha.weight", (32, h)), (b + "ssm_norm.weight", (128,)),
                          (b + "ssm_out.weight", (h, 4096))]  # fmt: skip
            f = 9216
        else:
            specs += [(b + "attn_norm.weight", (h,)), (b + "ffn_norm.weight", (h,))]
            if is_attn(arch, i):
                specs += [(b + "attn_q.weight", (12 * 128, h)), (b + "attn_k.weight", (512, h)),
                          (b + "attn_v.weight", (512, h)),
                          (b + "attn_output.weight", (h, 12 * 128))]  # fmt: skip
            else:  # inner 3072, 48 heads, one group of state 128
                conv = 3072 + 2 * 128
                specs += [(b + "ssm_in.weight", (2 * 3072 + 2 * 128 + 48, h)),
                          (b + "ssm_conv1d.weight", (conv, 4)), (b + "ssm_conv1d.bias", (conv,)),
                          (b + "ssm_dt.bias", (48,)), (b + "ssm_a", (48, 1)),
                          (b + "ssm_d", (48, 1)), (b + "ssm_norm.weight", (1, 3072)),
                          (b + "ssm_out.weight", (h, 3072))]  # fmt: skip
            f = 4096
        specs += [(b + "ffn_gate.weight", (f, h)), (b + "ffn_up.weight", (f, h)),
                  (b + "ffn_down.weight", (h, f))]  # fmt: skip
    return specs


def _typed(v: Any) -> tuple[Any, Any, Any]:
    from gguf import GGUFValueType as T

    if isinstance(v, list):
        return v, T.ARRAY, (T.INT32 if isinstance(v[0], int) else T.FLOAT32)
    if isinstance(v, bool):
        return v, T.BOOL, None
    if isinstance(v, int):
        return v, T.UINT32, None
    return (v, T.FLOAT32, None) if isinstance(v, float) else (v, T.STRING, None)


def _special(name: str, shp: tuple[int, ...], rng: np.random.Generator) -> np.ndarray | None:
    """The recurrent layers' small tensors, drawn as trained ones look (F32)."""
    n = int(np.prod(shp))
    if name.endswith("ssm_a"):
        return (-np.exp(rng.uniform(0.0, 2.7, n))).astype(np.float32).reshape(shp)
    if name.endswith("ssm_d"):
        return np.ones(shp, np.float32)
    if name.endswith("ssm_dt.bias"):
        dt = rng.uniform(0.01, 0.1, n)
        return np.log(np.expm1(dt)).astype(np.float32).reshape(shp)
    if name.endswith(("ssm_conv1d.weight", "ssm_conv1d.bias")):
        return (0.2 * rng.standard_normal(shp)).astype(np.float32)
    return None


def write_f16(
    path: Path, arch: str, layers: int, vocab: int, seed: int = 28,
    shape: hybrid_shapes.Hybrid | None = None,
) -> Path:  # fmt: skip
    """Write the random F16 GGUF (vectors and the recurrent layers' small tensors F32);
    `shape`: other sizes than the real model's for a `bench.hybrid_shapes` arch (tests)."""
    import gguf

    label, h = REAL[arch][0], REAL[arch][1]
    specs, kv = tensor_specs(arch, layers, vocab), keys(arch, layers)
    if shape is not None:
        label, h = shape.label, shape.hidden
        specs = hybrid_shapes.tensor_specs(arch, layers, vocab, shape)
        kv = hybrid_shapes.keys(arch, layers, shape)
    w = gguf.GGUFWriter(path, arch)
    meta = {"general.name": f"{label} shapes, {layers} layers, random weights",
            "general.file_type": 1, f"{arch}.embedding_length": h,
            f"{arch}.block_count": layers, f"{arch}.vocab_size": vocab,
            "tokenizer.ggml.model": "test"}  # fmt: skip
    meta |= {f"{arch}.{k}": v for k, v in kv.items()}
    for key, v in meta.items():
        w.add_key_value(key, *_typed(v))
    w.add_key_value("tokenizer.ggml.tokens", [f"tok_{i}" for i in range(vocab)],
                    gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)  # fmt: skip
    w.add_key_value("tokenizer.ggml.token_type", [1] * vocab, gguf.GGUFValueType.ARRAY,
                    gguf.GGUFValueType.INT32)  # fmt: skip
    # F32 where llama.cpp's ops want it: lfm2's short convolution (ggml_ssm_conv asserts)
    small = ("ssm_", "shortconv.conv")
    f32 = {n for n, s in specs if len(s) == 1 or any(x in n for x in small) and min(s) < 32}
    for name, shp in specs:
        dtype = np.dtype(np.float32 if name in f32 else np.float16)
        w.add_tensor_info(name, shp, dtype, int(np.prod(shp)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool, rng = _pool(seed), np.random.default_rng(seed + 1)
    for name, shp in specs:
        arr = _special(name, shp, rng)
        if arr is None:
            arr = _tensor(pool, rng, shp)
            arr = arr.astype(np.float32) if name in f32 else arr
        w.write_tensor_data(arr)
    w.close()
    return path


def synth_path(arch: str, layers: int, vocab: int) -> Path:
    """Where the Q4_K_M random model is cached."""
    return synth_dir() / f"{arch}-L{layers}-V{vocab}-random-h{FORMAT}-Q4_K_M.gguf"


def synth_model(arch: str, layers: int | None = None, vocab: int | None = None) -> Path:
    """The cached random Q4_K_M model of `arch`, built first if missing."""
    layers, vocab = layers or DEFAULT_LAYERS[arch], vocab or REAL[arch][3]
    target = synth_path(arch, layers, vocab)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    f16 = target.with_name(f".{target.stem}.{os.getpid()}.f16.gguf")
    part = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        print(f"hybrid_synth: writing {f16}", file=sys.stderr, flush=True)
        write_f16(f16, arch, layers, vocab)
        print(f"hybrid_synth: quantizing {arch} to Q4_K_M", file=sys.stderr, flush=True)
        quantize(f16, part, "Q4_K_M")
        os.replace(part, target)
    finally:
        f16.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.hybrid_synth [ARCH|all] [--layers N] [--vocab N]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.hybrid_synth", description=__doc__)
    ap.add_argument("which", nargs="?", default="all", choices=[*REAL, "all"])
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    args = ap.parse_args(argv)
    for arch in list(REAL) if args.which == "all" else [args.which]:
        print(synth_model(arch, args.layers, args.vocab), flush=True)


if __name__ == "__main__":
    main()
