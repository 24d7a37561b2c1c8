"""The same kernels built with and without AVX-512, side by side, against llama.cpp (issue 32):
`python -m bench.quant_isa [--prepare] [--types Q4_K,IQ4_XS] [--rows 1,4,512] [--before DIR]
[--threads 2]`.

Per quantization type, on `bench.quant_matmul`'s Gemma 1B shapes and weights, one matmul's
median time (activation quantization included) in three or four builds:

- ``avx512``: the library as ``loraserve build-kernels`` builds it for this CPU (AVX-512 VNNI
  where the CPU has it: dpbusd/dpwssd, and the 512-bit pair tiles of packed_z*.h);
- ``avx2``: the same sources built with ``LORASERVE_KERNEL_NO_AVX512=1`` (``-mno-avx512f``:
  maddubs/madd, 256-bit tiles only), which gives the very same bits (test_quant_isa);
- ``before`` (with ``--before DIR``): the native build of another checkout, e.g. the commit
  before a change (``git archive <commit> | tar -x -C DIR``);
- ``llama``: the peer build's libggml (`bench.quant_matmul.theirs`).

Each build runs in a process of its own, all cases one after the other; the builds take turns
(native, AVX2, before, then llama.cpp, then the kernel builds again in the reverse order) and
each case's time is the lower of its two medians, so a slow spell of the machine does not
fall on one build alone. ``--prepare`` builds the libraries and writes the weights (do it
outside a bench window). Prints per type and row count the AVX2 build's time over the
AVX-512 one's (above 1: the wider build is faster) and llama.cpp's time over each build's,
and writes bench/results/quant_isa_<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import quant_matmul as qm

ROOT = Path(__file__).resolve().parents[1]
AVX2_CACHE = Path.home() / ".cache" / "loraserve" / "bench" / "avx2-kernels"
CODE = r"""
import json, sys
sys.path.insert(0, {root!r})
from loraserve import cbuild
from bench import quant_matmul as qm
out = {{"isa": cbuild.library().ls_isa(), "us": {{}}}}
for t, shape, n, k in {cases!r}:
    if {prepare!r}:
        break
    for r, us in qm.ours(t, n, k, {rows!r}, {seconds!r}, {threads!r}).items():
        out["us"][f"{{t}}/{{shape}}/{{r}}"] = us
print(json.dumps(out))
"""


def _env(build: str) -> dict[str, str]:
    if build != "avx2":
        return {**os.environ}
    return {**os.environ, "LORASERVE_KERNEL_NO_AVX512": "1", "LORASERVE_CACHE": str(AVX2_CACHE),
            "LORASERVE_PREBUILT_DIR": str(AVX2_CACHE / "none")}  # fmt: skip


def run_build(
    build: str,
    root: Path,
    todo: list[tuple[str, str, int, int]],
    rows: list[int],
    seconds: float,
    prepare: bool = False,
    threads: int = qm.THREADS,
) -> dict[str, Any]:
    """One build's medians (microseconds) per 'type/shape/rows', and its ls_isa bits."""
    code = CODE.format(root=str(root), cases=todo, rows=rows, seconds=seconds, prepare=prepare,
                       threads=threads)  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(build), cwd=root, check=False)  # fmt: skip
    if out.returncode != 0:
        sys.exit(f"{build} build failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, run the builds in turn and llama.cpp, print and write."""
    ap = argparse.ArgumentParser(prog="python -m bench.quant_isa", description=__doc__)
    ap.add_argument("--prepare", action="store_true", help="only build and write the weights")
    ap.add_argument("--types", default=",".join(qm.TYPES))
    ap.add_argument("--rows", default="1,4,512")
    ap.add_argument("--shapes", default=",".join(qm.SHAPES))
    ap.add_argument("--seconds", type=float, default=0.1, help="timing per point and build")
    ap.add_argument("--before", type=Path, help="another checkout, timed as 'before'")
    ap.add_argument("--threads", type=int, default=qm.THREADS, help="threads of every build")
    args = ap.parse_args(argv)
    todo = [c for c in qm.cases(args.types.split(",")) if c[1] in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    builds = {"avx512": ROOT, "avx2": ROOT} | ({"before": args.before} if args.before else {})
    if args.prepare:
        qm.prepare(todo)
        for b, root in builds.items():
            print(b, "isa", run_build(b, root, todo, rows, 0.0, prepare=True)["isa"], flush=True)
        return
    times: dict[str, dict[str, float]] = {}
    isa: dict[str, int] = {}
    order = list(builds)
    llama: dict[str, dict[str, Any]] = {}
    for turn in (order, ["llama"], order[::-1]):
        for b in turn:
            if b == "llama":
                for t, shape, n, k in todo:
                    for r, v in qm.theirs(t, n, k, rows, args.seconds, args.threads).items():
                        llama[f"{t}/{shape}/{r}"] = v
                continue
            got = run_build(b, builds[b], todo, rows, args.seconds, threads=args.threads)
            isa[b] = got["isa"]
            for key, us in got["us"].items():
                times.setdefault(b, {})[key] = min(us, times.get(b, {}).get(key, float("inf")))
            print(f"{b}: {len(got['us'])} points", flush=True)
    results = []
    for t, shape, n, k in todo:
        for r in rows:
            key = f"{t}/{shape}/{r}"
            peer = llama[key]
            one = {"type": t, "shape": shape, "n": n, "k": k, "rows": r,
                   "llama_us": peer["us"], "llama_repacked": bool(peer["repacked"])}  # fmt: skip
            for b in builds:
                one[f"{b}_us"] = round(times[b][key], 2)
            results.append(one)
    _report(results, rows, list(builds), isa, args)


def _geo(v: list[float]) -> float:
    return round(statistics.geometric_mean(v), 3)


def _report(
    results: list[dict[str, Any]],
    rows: list[int],
    builds: list[str],
    isa: dict[str, int],
    args: argparse.Namespace,
) -> None:
    from bench.servers import machine, machine_load

    summary: dict[str, dict[str, dict[str, float]]] = {}
    for t in dict.fromkeys(x["type"] for x in results):
        for r in rows:
            sel = [x for x in results if x["type"] == t and x["rows"] == r]
            s = {"avx2_over_avx512": _geo([x["avx2_us"] / x["avx512_us"] for x in sel])}
            for b in builds:
                s[f"llama_over_{b}"] = _geo([x["llama_us"] / x[f"{b}_us"] for x in sel])
            summary.setdefault(t, {})[str(r)] = s
    print("geometric means over shapes (time ratios; above 1: the second is faster):")
    for t, v in summary.items():
        for r, s in v.items():
            print(f"  {t:8s} M={r:<4s} " + "  ".join(f"{k} {x:.2f}" for k, x in s.items()))
    qm.RESULTS.mkdir(exist_ok=True)
    out = qm.RESULTS / f"quant_isa_{time.strftime('%Y-%m-%d_%H%M%S', time.gmtime())}.json"
    out.write_text(json.dumps({"threads": args.threads, "machine": machine(),
                               "load": machine_load(), "isa": isa,
                               "before": str(args.before) if args.before else None,
                               "seconds": args.seconds, "summary": summary, "results": results},
                              indent=1))  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
