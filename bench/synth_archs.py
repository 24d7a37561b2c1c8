"""Random-weights GGUF models with the real layer shapes of MoE and dense models, for the
architecture speed bench (`bench/arch_speed.py`, issue 27 item 5).

`python -m bench.synth_archs [ARCH|all] [--layers N] [--vocab N]
[--check]` prints the paths, building what is missing (`bench.synth`'s writer and
llama-quantize, one tensor in memory at a time, F16 then Q4_K_M; cached in
`$LORASERVE_SYNTH_CACHE`, default `~/.cache/loraserve/synth`, by arch, layers and vocab).

Shapes are the public `config.json` values of Qwen3-30B-A3B (`qwen3moe`), gpt-oss-20b
(`gpt-oss`: alternating 128-token sliding window, attention sinks, biases, YaRN 32x) and
DeepSeek-V2-Lite (`deepseek2`: MLA without a query compression, kv rank 512, one leading
dense layer, 64 routed + 2 shared experts, YaRN 40x), with fewer layers (default 4) so that
each Q4_K_M file is 1.5-3.5 GB. The dense families (llama, qwen2, qwen3, phi3, gemma2,
granite, starcoder2, cohere2, olmo2, glm4, smollm3, exaone4, seed_oss, mistral3) take
their shapes and tensor layouts from `bench.arch_shapes` / `bench.arch_tensors`.
The tokenizer is llama.cpp's `test` vocabulary (no tokenizer of these models is on the
machine) with the real vocabulary size, so the embedding and output layer cost what they
do in the real models. Tensor names and metadata keys are those of llama.cpp's writers
(`tests/data/archs/<arch>.json` lists them).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.arch_shapes import SHAPES, ArchShape
from bench.arch_tensors import tensor_specs
from bench.synth import SCALE, quantize, synth_dir

__all__ = ["SHAPES", "ArchShape", "shape_of", "synth_model", "synth_path", "tensor_specs"]

FORMAT = 2  # bump when the generator changes, so cached files are rebuilt
POOL = 1 << 24  # random F16 values every matrix is cut from (fast on a loaded machine)


def synth_path(arch: str, layers: int, vocab: int, qtype: str = "Q4_K_M") -> Path:
    """Where the quantized random model of `arch` with `layers` layers is cached."""
    return synth_dir() / f"{arch}-L{layers}-V{vocab}-random-v{FORMAT}-{qtype}.gguf"


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
    return ArchShape(
        s.arch, s.label, s.hidden, layers or s.layers, vocab or s.vocab, s.keys, s.flags
    )


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
