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
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from loraserve.lora.adapter import load_adapter
from loraserve.lora.adapter_write import check_output, write_adapter
from loraserve.lora.merge import MODES, Merged, MergeError, Term, max_rank, merge_target
from loraserve.lora.merge_inputs import Source, parse_spec, peek, resolve

_MODES_HELP = """cat: exact, the ranks add up; linear: PEFT's linear combination (approximate,
equal ranks); ortho-svd (default): the best rank-r approximation of the weighted sum"""


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


def run(args: argparse.Namespace) -> Result:
    """Load, check, merge and write; raises `MergeError`/`AdapterError` before writing."""
    t0 = time.perf_counter()
    sources = [peek(*parse_spec(spec)) for spec in args.inputs]
    if all(s.weight == 0 for s in sources):
        raise MergeError("all weights are zero: the merged adapter would do nothing")
    check_output(args.output, args.format)
    cfg, shapes = resolve(args, sources)
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
