"""Random-weights GGUF models with the real shapes of Gemma 3 1B and 4B, for S8 (scaling).

`python -m bench.synth [1b|4b|all] [--check]` prints the paths, building what is missing:
the tokenizer and every other metadata key are copied from the real Gemma 3 270M file (the
default model), the shape keys are replaced, the tensors are written in F16 with the `gguf`
package's writer one tensor at a time (a 4B F16 file is ~8 GB), and llama-quantize turns that
into Q4_K_M. Results are cached in `$LORASERVE_SYNTH_CACHE` (default
`~/.cache/loraserve/synth`) by shape name; the F16 intermediate is deleted. `--check` starts
llama-server on each file (`/health`, one `/completion`).

Shapes are those of Google's Gemma 3 configs (gemma_pytorch `get_config_for_1b/4b`, HF
`config.json`): the 4B text model also has linear RoPE scaling by 8 on its global layers.
Weights are normal * 0.02; norms are 1 + normal * 0.02, since Gemma's GGUF stores (1 + w).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = 1  # bump when the generator changes, so cached files are rebuilt
ARCH = "gemma3"
SCALE = 0.02
ROW_CHUNK = 1 << 14


@dataclass(frozen=True)
class Shape:
    """The hyperparameters of one Gemma 3 text model."""

    name: str
    label: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    sliding_window: int
    context_length: int
    rope_scaling: float | None = None


SHAPES = {
    "270m": Shape("270m", "270M", 640, 18, 4, 1, 256, 2048, 512, 32768),
    "1b": Shape("1b", "1B", 1152, 26, 4, 1, 256, 6912, 512, 32768),
    "4b": Shape("4b", "4B", 2560, 34, 8, 4, 256, 10240, 1024, 131072, rope_scaling=8.0),
}


def synth_dir() -> Path:
    """`$LORASERVE_SYNTH_CACHE` or `~/.cache/loraserve/synth`."""
    env = os.environ.get("LORASERVE_SYNTH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "loraserve" / "synth"


def synth_path(name: str, qtype: str = "Q4_K_M") -> Path:
    """Where the quantized random-weights model of shape `name` is cached."""
    return synth_dir() / f"gemma3-{name}-random-v{FORMAT}-{qtype}.gguf"


def tensor_specs(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor, as llama.cpp names Gemma 3's (tied output)."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    specs: list[tuple[str, tuple[int, ...]]] = [
        ("output_norm.weight", (h,)),
        ("token_embd.weight", (vocab, h)),
    ]
    for i in range(shape.layers):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (h,)),
            (b + "attn_q.weight", (q, h)),
            (b + "attn_k.weight", (kv, h)),
            (b + "attn_v.weight", (kv, h)),
            (b + "attn_q_norm.weight", (shape.head_dim,)),
            (b + "attn_k_norm.weight", (shape.head_dim,)),
            (b + "attn_output.weight", (h, q)),
            (b + "post_attention_norm.weight", (h,)),
            (b + "ffn_norm.weight", (h,)),
            (b + "ffn_gate.weight", (shape.ffn, h)),
            (b + "ffn_up.weight", (shape.ffn, h)),
            (b + "ffn_down.weight", (h, shape.ffn)),
            (b + "post_ffw_norm.weight", (h,)),
        ]
    return specs


def read_template(path: Path) -> dict[str, tuple[Any, Any, Any]]:
    """Every metadata key of a GGUF as key -> (value, type, array element type), strings
    as raw bytes so they are copied exactly (the reader's own fields are left out)."""
    from gguf import GGUFReader, GGUFValueType

    out: dict[str, tuple[Any, Any, Any]] = {}
    for name, f in GGUFReader(path).fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype, sub = f.types[0], (f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None)
        if vtype == GGUFValueType.STRING:
            value: Any = f.parts[-1].tobytes()
        elif sub == GGUFValueType.STRING:
            value = [f.parts[i].tobytes() for i in f.data]
        else:
            value = f.contents()
        out[name] = (value, vtype, sub)
    return out


def shape_metadata(
    template: dict[str, tuple[Any, Any, Any]], shape: Shape
) -> dict[str, tuple[Any, Any, Any]]:
    """The template's metadata with the shape keys, names and file type of `shape`."""
    from gguf import GGUFValueType as T

    u32, f32, s = T.UINT32, T.FLOAT32, T.STRING
    kv = {k: v for k, v in template.items() if not k.startswith(f"{ARCH}.rope.scaling.")}
    new = {
        "general.name": (f"Gemma 3 {shape.label} random weights", s),
        "general.size_label": (shape.label, s),
        "general.file_type": (1, u32),  # all F16 (1-D tensors F32) until quantized
        f"{ARCH}.context_length": (shape.context_length, u32),
        f"{ARCH}.embedding_length": (shape.hidden, u32),
        f"{ARCH}.block_count": (shape.layers, u32),
        f"{ARCH}.feed_forward_length": (shape.ffn, u32),
        f"{ARCH}.attention.head_count": (shape.heads, u32),
        f"{ARCH}.attention.head_count_kv": (shape.kv_heads, u32),
        f"{ARCH}.attention.key_length": (shape.head_dim, u32),
        f"{ARCH}.attention.value_length": (shape.head_dim, u32),
        f"{ARCH}.attention.sliding_window": (shape.sliding_window, u32),
    }
    if shape.rope_scaling is not None:
        new[f"{ARCH}.rope.scaling.type"] = ("linear", s)
        new[f"{ARCH}.rope.scaling.factor"] = (shape.rope_scaling, f32)
    kv.update({k: (v, t, None) for k, (v, t) in new.items()})
    return kv


def _random(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) == 1:  # a norm weight, stored as 1 + w
        return (1.0 + SCALE * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    out = np.empty(shape, np.float16)
    for r in range(0, shape[0], ROW_CHUNK):
        block = rng.standard_normal((min(ROW_CHUNK, shape[0] - r), shape[1]), dtype=np.float32)
        block *= SCALE
        out[r : r + ROW_CHUNK] = block
    return out


def _tensors(
    specs: list[tuple[str, tuple[int, ...]]], seed: int
) -> Iterator[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    for name, shp in specs:
        yield name, _random(rng, shp)


def write_f16(
    path: Path, shape: Shape, template: dict[str, tuple[Any, Any, Any]], seed: int = 8
) -> Path:
    """Write a random-weights F16 GGUF of `shape` (1-D tensors F32), one tensor in memory at a
    time; the vocabulary size is the template's token count."""
    import gguf

    vocab = len(template["tokenizer.ggml.tokens"][0])
    specs = tensor_specs(shape, vocab)
    w = gguf.GGUFWriter(path, ARCH)
    for key, (value, vtype, sub) in shape_metadata(template, shape).items():
        w.add_key_value(key, value, vtype, sub)
    for name, shp in specs:
        dtype = np.dtype(np.float32 if len(shp) == 1 else np.float16)
        w.add_tensor_info(name, shp, dtype, int(np.prod(shp)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _name, arr in _tensors(specs, seed):
        w.write_tensor_data(arr)
    w.close()
    return path


def quantize(src: Path, dst: Path, qtype: str = "Q4_K_M", threads: int = 2) -> Path:
    """`llama-quantize src dst qtype threads` (llama-quantize built next to llama-server)."""
    from bench.peer import obtain_quantize

    binary = obtain_quantize()
    if binary is None:
        raise RuntimeError("no llama-quantize (python -m bench.peer --quantize --build)")
    cmd = [str(binary), str(src), str(dst), qtype, str(threads)]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"llama-quantize failed ({res.returncode}):\n{res.stdout[-2000:]}")
    return dst


def synth_model(name: str, template: Path | None = None, qtype: str = "Q4_K_M") -> Path:
    """The cached random-weights model of shape `name`, built first if missing."""
    target = synth_path(name, qtype)
    if target.is_file():
        return target
    if template is None:
        from loraserve.model.default import default_model_path

        template = default_model_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    f16 = target.with_name(f".{target.stem}.{os.getpid()}.f16.gguf")
    part = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        print(f"synth: writing {f16}", file=sys.stderr)
        write_f16(f16, SHAPES[name], read_template(template))
        print(f"synth: quantizing to {qtype}", file=sys.stderr)
        quantize(f16, part, qtype)
        os.replace(part, target)
    finally:
        f16.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    return target


def check_loads(path: Path, threads: int = 2) -> dict[str, Any]:
    """Start llama-server on `path`: start-up seconds and one short completion's text."""
    import httpx

    from bench.peer import find_peer
    from bench.servers import free_port, launch, peer_kind, server_argv

    binary = find_peer()
    if binary is None:
        raise RuntimeError("no llama-server (python -m bench.peer --build)")
    port = free_port()
    argv = server_argv(peer_kind(binary), path, port, threads=threads, parallel=1, ctx=512,
                       cache_ram=0)  # fmt: skip
    with launch("llama-server", argv, port, timeout=300) as srv:
        body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0.0}
        r = httpx.post(f"{srv.url}/completion", json=body, timeout=120)
        r.raise_for_status()
        data = r.json()
        return {"startup_s": srv.startup_s, "content": data["content"],
                "tokens_predicted": data.get("tokens_predicted")}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.synth [1b|4b|all] [--check]`: print the paths, building what is
    missing."""
    ap = argparse.ArgumentParser(prog="python -m bench.synth", description=__doc__)
    ap.add_argument("which", nargs="?", default="all", choices=[*SHAPES, "all"])
    ap.add_argument("--check", action="store_true", help="start llama-server on each file")
    args = ap.parse_args(argv)
    names = ["1b", "4b"] if args.which == "all" else [args.which]
    for name in names:
        path = synth_model(name)
        print(path, flush=True)
        if args.check:
            print(f"  {check_loads(path)}", flush=True)


if __name__ == "__main__":
    main()
