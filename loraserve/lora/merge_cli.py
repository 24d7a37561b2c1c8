"""`loraserve merge`: combine LoRA adapters (GGUF files or PEFT folders) into one adapter.

    loraserve merge a.gguf:0.7 b_peft_dir:0.3 --mode ortho-svd --rank 16 -o merged.gguf

No model is needed: the base architecture and the base tensor shapes come from the adapters
themselves, and every input must agree on them (``--model`` also checks them against a model).
The output is a GGUF LoRA (``.gguf`` or ``--format gguf``) or a PEFT folder, with factor 1
(serve it at scale 1) and a record of its inputs in its metadata. On any error nothing is
written and the exit status is 1.

llama q/k: GGUF files store ``lora_b`` rows permuted (llama.cpp's converter). Without
``--model`` the head counts are unknown, so a llama merge keeps the layout of its inputs and
refuses to mix GGUF and PEFT layouts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from loraserve.lora.adapter import _PEFT_KEY, Adapter, _module_key, load_adapter
from loraserve.lora.adapter_write import ARCH_KEY, check_output, write_adapter
from loraserve.lora.merge import MODES, Merged, MergeError, Term, max_rank, merge_target
from loraserve.model.config import ModelConfig
from loraserve.model.hf import hf_to_gguf_name

Shapes = dict[str, tuple[int, ...]]
_QK = (".attn_q.weight", ".attn_k.weight")
_MODES_HELP = """cat: exact, the ranks add up; linear: PEFT's linear combination (approximate,
equal ranks); ortho-svd (default): the best rank-r approximation of the weighted sum"""


@dataclass
class Source:
    """One input: where it is, its weight and what its headers say."""

    path: Path
    weight: float
    fmt: str  # "gguf" or "peft"
    arch: str | None  # None: a PEFT folder that does not record it
    shapes: Shapes  # target -> base shape (out, in) or (E, out, in), from the pairs' shapes
    base_model: str | None = None
    adapter: Adapter | None = None


@dataclass
class Row:
    """The report line of one target."""

    target: str
    shape: tuple[int, ...]
    input_ranks: list[int]
    merged: Merged


@dataclass
class Result:
    """What `run` did: the report rows, the file written and how long it took."""

    rows: list[Row]
    output: Path
    fmt: str
    seconds: float
    sources: list[Source]

    @property
    def rel_error(self) -> float:
        """Relative Frobenius error over all targets together."""
        num = sum((r.merged.rel_error * r.merged.norm) ** 2 for r in self.rows)
        den = sum(r.merged.norm**2 for r in self.rows)
        return math.sqrt(num / den) if den else 0.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of ``loraserve merge``."""
    ap = argparse.ArgumentParser(
        prog="loraserve merge", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("inputs", nargs="+", metavar="ADAPTER[:WEIGHT]", help="GGUF LoRA or PEFT dir")
    ap.add_argument("-o", "--output", required=True, type=Path, help="file.gguf or PEFT folder")
    ap.add_argument("--mode", choices=MODES, default="ortho-svd", help=_MODES_HELP)
    ap.add_argument("--rank", type=_rank, default=None, help="ortho-svd: N or auto (default)")
    ap.add_argument("--energy", type=_energy, default=0.99, help="--rank auto: energy kept")
    ap.add_argument("--format", choices=("gguf", "peft"), default=None, help="default: by suffix")
    ap.add_argument("--outtype", choices=("f32", "f16"), default="f32", help="tensor type")
    ap.add_argument("--model", type=Path, default=None, help="check against this GGUF/HF model")
    ap.add_argument("--arch", default=None, help="base architecture, for PEFT-only inputs")
    args = ap.parse_args(argv)
    if args.rank is not None and args.mode != "ortho-svd":
        ap.error(f"--rank applies to --mode ortho-svd only (mode {args.mode} sets the rank)")
    args.rank = args.rank or "auto"
    args.format = args.format or ("gguf" if args.output.suffix == ".gguf" else "peft")
    return args


def _rank(text: str) -> int | str:
    if text == "auto" or (text.isdigit() and int(text) > 0):
        return text if text == "auto" else int(text)
    raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {text!r}")


def _energy(text: str) -> float:
    try:
        if 0.0 < (value := float(text)) <= 1.0:
            return value
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}")


def parse_spec(spec: str) -> tuple[Path, float]:
    """``path[:weight]`` -> (path, weight); the weight defaults to 1."""
    path, sep, tail = spec.rpartition(":")
    if not sep or Path(spec).exists():
        return Path(spec), 1.0
    try:
        weight = float(tail)
    except ValueError:
        raise MergeError(f"{spec!r}: the weight after ':' must be a number, got {tail!r}") from None
    if not math.isfinite(weight):
        raise MergeError(f"{spec!r}: the weight must be finite")
    return Path(path), weight


def peek(path: Path, weight: float) -> Source:
    """Format, architecture and base shapes of an input, from its headers only."""
    if not path.exists():
        raise MergeError(f"{path}: no such adapter file or folder")
    if path.is_dir():
        return _peek_peft(path, weight)
    from loraserve.model.gguf import GGUFFile

    try:
        with GGUFFile(path) as gg:
            meta, infos = gg.metadata, gg.tensors
    except (ValueError, OSError) as e:
        raise MergeError(f"{path}: not a GGUF LoRA file or PEFT folder ({e})") from None
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise MergeError(f"{path}: a GGUF file but not a LoRA adapter (general.type, adapter.type)")
    shapes: Shapes = {}
    for name, info in infos.items():
        base, _, part = name.rpartition(".")
        if part in ("lora_a", "lora_b"):
            old = shapes.get(base, (*info.shape[:-2], 0, 0))
            dims = (info.shape[-2], old[-1]) if part == "lora_b" else (old[-2], info.shape[-1])
            shapes[base] = (*info.shape[:-2], *dims)
    arch = meta.get("general.architecture")
    return Source(path, weight, "gguf", str(arch) if arch else None, shapes)


def _peek_peft(path: Path, weight: float) -> Source:
    from safetensors import safe_open

    try:
        conf = json.loads((path / "adapter_config.json").read_text())
        with safe_open(str(path / "adapter_model.safetensors"), "pt") as st:
            dims = {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
            arch = (st.metadata() or {}).get(ARCH_KEY)
    except Exception as e:  # missing files, bad JSON, corrupt safetensors
        raise MergeError(f"{path}: not a readable PEFT adapter folder ({e})") from None
    if not isinstance(conf, dict):
        raise MergeError(f"{path}/adapter_config.json: not a JSON object")
    shapes: Shapes = {}
    for key, shape in dims.items():
        m = _PEFT_KEY.match(key)
        target = m and hf_to_gguf_name(_module_key(m.group(1)) + ".weight", arch or "llama")
        if m and target and m.group(2) in ("lora_A", "lora_B"):
            old = shapes.get(target, (0, 0))
            shapes[target] = (shape[0], old[1]) if m.group(2) == "lora_B" else (old[0], shape[1])
    return Source(path, weight, "peft", arch, shapes, conf.get("base_model_name_or_path"))


def _model_info(path: Path) -> tuple[ModelConfig, Shapes]:
    if path.is_file():
        from loraserve.model.gguf import GGUFFile

        with GGUFFile(path) as gg:
            cfg = ModelConfig.from_gguf(gg.metadata, set(gg.tensors))
            shapes = {n: tuple(i.shape) for n, i in gg.tensors.items() if len(i.shape) in (2, 3)}
        if "output.weight" not in shapes and "token_embd.weight" in shapes:
            shapes["output.weight"] = shapes["token_embd.weight"]
        return cfg, shapes
    from loraserve.lora.registry import base_shapes
    from loraserve.model.loader import load_model

    model = load_model(path)
    return model.config, base_shapes(model.decoder)


def _resolve(args: argparse.Namespace, sources: list[Source]) -> tuple[ModelConfig, Shapes]:
    """The config to load the inputs with and the base shapes they must fit."""
    cfg, shapes = _model_info(args.model) if args.model else (None, {})
    named = {str(s.path): s.arch for s in sources if s.arch}
    named |= {"--model": cfg.arch} if cfg else {}
    named |= {"--arch": args.arch} if args.arch else {}
    if len(set(named.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in named.items())
        raise MergeError(f"the inputs are for different base architectures ({listed})")
    arch = next(iter(named.values()), None)
    if arch is None and args.format == "gguf":
        raise MergeError(
            "the base architecture is unknown (PEFT folders do not record it): "
            "pass --arch NAME or --model PATH"
        )
    seen: dict[str, tuple[tuple[int, ...], Path]] = {}
    for s in sources:
        for t, shp in s.shapes.items():
            if t in seen and seen[t][0] != shp:
                raise MergeError(
                    f"{t}: {seen[t][1]} fits a base tensor of shape {seen[t][0]} but {s.path} "
                    f"one of {shp}: the adapters are for different base models"
                )
            seen.setdefault(t, (shp, s.path))
    if cfg is not None:
        return cfg, shapes
    formats = {s.fmt for s in sources} | {args.format}
    if arch == "llama" and len(formats) > 1 and any(t.endswith(_QK) for t in seen):
        raise MergeError(
            "llama q/k LoRA rows are permuted in GGUF files and not in PEFT "
            "folders; converting between them needs the head counts: pass --model"
        )
    try:
        cfg = ModelConfig(arch or "llama", 0, 0, 0, 1, 1, 1, 0, 0.0, 0.0, 0)
    except ValueError as e:
        raise MergeError(f"base architecture: {e}") from None
    return cfg, {t: shp for t, (shp, _) in seen.items()}


def run(args: argparse.Namespace) -> Result:
    """Load, check, merge and write; raises `MergeError`/`AdapterError` before writing."""
    t0 = time.perf_counter()
    sources = [peek(*parse_spec(spec)) for spec in args.inputs]
    if all(s.weight == 0 for s in sources):
        raise MergeError("all weights are zero: the merged adapter would do nothing")
    check_output(args.output, args.format)
    cfg, shapes = _resolve(args, sources)
    terms: dict[str, list[Term]] = {}
    for s in sources:
        s.adapter = load_adapter(s.path, cfg, shapes)
        for t, w in s.adapter.weights.items():
            if s.weight != 0:
                terms.setdefault(t, []).append(Term(w.a, w.b, s.weight * w.factor))
    rank = None if args.rank == "auto" else args.rank
    most = max(max_rank(ts) for ts in terms.values())
    if rank is not None and rank > most:
        raise MergeError(
            f"--rank {rank} is larger than possible: every merged delta has rank at "
            f"most {most} (the sum of its input ranks, at most min(out, in))"
        )
    dtype = torch.float16 if args.outtype == "f16" else torch.float32
    rows = []
    for t in tqdm(sorted(terms), desc="merging", unit="target", disable=None, file=sys.stderr):
        try:
            merged = merge_target(terms[t], args.mode, rank, args.energy, dtype)
        except MergeError as e:
            raise MergeError(f"{t}: {e}") from None
        rows.append(Row(t, shapes[t], [x.rank for x in terms[t]], merged))
    pairs = {r.target: (r.merged.a, r.merged.b) for r in rows if r.merged.rank}
    if not pairs:
        raise MergeError(
            "the weighted sum is zero for every target (all-zero adapters, or "
            "weights that cancel): nothing to write"
        )
    result = Result(rows, args.output, args.format, 0.0, sources)
    record: dict[str, Any] = {
        "inputs": [str(s.path) for s in sources],
        "weights": [s.weight for s in sources],
        "content_ids": [s.adapter.content_id for s in sources if s.adapter],
        "mode": args.mode,
        **({"rank": str(args.rank)} if args.mode == "ortho-svd" else {}),
        **({"energy": args.energy} if args.mode == "ortho-svd" and rank is None else {}),
        "rel_error": result.rel_error,
    }
    known = args.model or args.arch or any(s.arch for s in sources)
    bases = {s.base_model for s in sources if s.base_model}
    write_adapter(
        args.output, args.format, pairs, record,
        arch=cfg.arch if known else None, qk_heads=(cfg.n_heads, cfg.n_kv_heads),
        base_model=bases.pop() if len(bases) == 1 else None,
    )  # fmt: skip
    result.seconds = time.perf_counter() - t0
    return result


def report(result: Result) -> str:
    """The per-target table and the totals."""
    lines = [f"{'target':<34} {'base shape':>14} {'input ranks':>12} {'rank':>5} {'rel.error':>10}"]
    for r in result.rows:
        shape = "x".join(map(str, r.shape))
        ranks = "+".join(map(str, r.input_ranks))
        rank = str(r.merged.rank) if r.merged.norm else "zero"
        err = r.merged.rel_error
        lines.append(f"{r.target:<34} {shape:>14} {ranks:>12} {rank:>5} {err:>10.2e}")
    kept = [r for r in result.rows if r.merged.rank]
    ranks = [r.merged.rank for r in kept]
    params = sum(r.merged.a.numel() + r.merged.b.numel() for r in kept)
    worst = max(result.rows, key=lambda r: r.merged.rel_error)
    dropped = len(result.rows) - len(kept)
    lines.append(
        f"total: {len(kept)} targets, rank {min(ranks)}-{max(ranks)} (mean "
        f"{sum(ranks) / len(ranks):.1f}), {params:,} parameters; relative error "
        f"{result.rel_error:.2e} over all targets, largest {worst.merged.rel_error:.2e} "
        f"({worst.target})" + (f"; {dropped} zero targets dropped" if dropped else "")
    )
    lines.append(
        f"merged {len(result.sources)} adapters in {result.seconds:.2f} s -> {result.output} "
        f"({result.fmt}); serve it at scale 1"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``loraserve merge``; exits 1 with a message on bad input."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        result = run(args)
    except (ValueError, OSError) as e:  # MergeError, AdapterError, a file that cannot be written
        print(f"loraserve merge: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(report(result))
