"""Per quantization type, one matmul's time here against llama.cpp's (issue 32):
`python -m bench.quant_matmul [--prepare] [--types Q4_K,IQ4_XS] [--rows 1,4,512]
[--threads 2]`.

On Gemma 3 1B's projection shapes (ffn_up 6912 x 1152, ffn_down 1152 x 6912, attn_q
1024 x 1152, attn_output 1152 x 1024; a type of 256-value blocks only where K is whole
blocks, as llama-quantize falls back elsewhere), at 1, 4 and 512 activation rows, 2 threads
(`--threads`: both sides alike; 1 for a per-thread kernel comparison off a quiet machine):

- ours: `model.projection.matmul` (activations quantized per row, then the kernel) on the
  weight as the loader keeps it (`Matrix.pack`: repacked 8 rows to a group where the type
  has a packed kernel);
- llama.cpp's: `scripts/ggml_matmul_bench.c` against the peer build's libggml, the weight
  in the CPU backend's repacking buffer where the backend takes it (as llama-server's
  loader places weights), x float32 converted inside the op.

Both read the same weight bytes: random normal values quantized by ggml's own
`ggml_quantize_chunk` (an all-ones importance matrix where the type needs one), written
once by `--prepare` under ~/.cache/loraserve/bench/quant_matmul (slow for the IQ types; do
it outside a bench window). The two sides run one after the other, never at once. Prints,
per type and row count, the median times and their ratio (llama.cpp's time / ours: above 1
we are faster) and writes bench/results/quant_matmul_<timestamp>.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.peer import find_peer

THREADS = 2  # the default of --threads
SHAPES = {  # name -> (N out, K in)
    "ffn_up": (6912, 1152),
    "ffn_down": (1152, 6912),
    "attn_q": (1024, 1152),
    "attn_output": (1152, 1024),
}
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_S",
         "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4"]  # fmt: skip
CACHE = Path.home() / ".cache" / "loraserve" / "bench" / "quant_matmul"
RESULTS = Path(__file__).parent / "results"
SRC = Path(__file__).resolve().parents[1] / "scripts" / "ggml_matmul_bench.c"


def _tree() -> Path:
    peer = find_peer()
    if peer is None:
        sys.exit("llama-server's build not found: python -m bench.peer --build")
    return peer.parent.parent.parent  # <tree>/build/bin/llama-server


def _block(name: str) -> int:
    return 32 if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4") else 256


def cases(types: list[str]) -> list[tuple[str, str, int, int]]:
    """(type, shape name, N, K) for every shape whose K is whole blocks of the type."""
    return [(t, s, n, k) for t in types for s, (n, k) in SHAPES.items() if k % _block(t) == 0]


def _weights_path(t: str, n: int, k: int) -> Path:
    return CACHE / f"{t}_{n}x{k}.bin"


def prepare(todo: list[tuple[str, str, int, int]]) -> None:
    """Quantize random normal weights with ggml's quantizer into the cache (once)."""
    from loraserve.model.dequant import GGML_TYPE

    lib = ctypes.CDLL(str(_tree() / "build" / "bin" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]  # fmt: skip
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    CACHE.mkdir(parents=True, exist_ok=True)
    for t, _, n, k in todo:
        path = _weights_path(t, n, k)
        if path.exists():
            continue
        tid = GGML_TYPE[t]
        x = np.random.default_rng(n * 7 + k).standard_normal((n, k), dtype=np.float32)
        imat = np.ones(k, np.float32) if lib.ggml_quantize_requires_imatrix(tid) else None
        out = np.zeros(lib.ggml_row_size(tid, k) * n, np.uint8)
        t0 = time.perf_counter()
        lib.ggml_quantize_chunk(tid, x.ctypes.data, out.ctypes.data, 0, n, k,
                                None if imat is None else imat.ctypes.data)  # fmt: skip
        out.tofile(path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
        print(f"prepared {t} {n}x{k} in {time.perf_counter() - t0:.1f} s", flush=True)


def _binary() -> Path:
    tree = _tree()
    out = CACHE / "ggml_matmul_bench"
    if not out.exists() or out.stat().st_mtime < SRC.stat().st_mtime:
        CACHE.mkdir(parents=True, exist_ok=True)
        lib = tree / "build" / "bin"
        subprocess.run(["cc", "-O2", str(SRC), f"-I{tree / 'ggml' / 'include'}", f"-L{lib}",
                        "-lggml", "-lggml-base", "-lggml-cpu", "-lm", f"-Wl,-rpath,{lib}",
                        "-o", str(out)], check=True)  # fmt: skip
    return out


def theirs(
    t: str, n: int, k: int, rows: list[int], seconds: float, threads: int = THREADS
) -> dict[int, dict[str, Any]]:
    """llama.cpp's median microseconds per call for each row count (and whether repacked)."""
    from loraserve.model.dequant import GGML_TYPE

    argv = [str(_binary()), str(GGML_TYPE[t]), str(n), str(k), str(threads), str(seconds),
            str(_weights_path(t, n, k)), *map(str, rows)]  # fmt: skip
    lines = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return {r["m"]: r for r in map(json.loads, lines.splitlines())}


def ours(
    t: str, n: int, k: int, rows: list[int], seconds: float, threads: int = THREADS
) -> dict[int, float]:
    """Our median microseconds per call (activation quantization included) per row count."""
    import torch

    from loraserve.model.dequant import GGML_TYPE
    from loraserve.model.projection import Matrix, matmul

    torch.set_num_threads(threads)
    raw = torch.from_numpy(np.fromfile(_weights_path(t, n, k), np.uint8).reshape(n, -1))
    m = Matrix("w", raw, GGML_TYPE[t], (n, k)).pack()
    res = {}
    for r in rows:
        x = torch.randn(r, k, generator=torch.Generator().manual_seed(r))
        out = torch.empty(r, n)
        matmul(x, m, out)  # warm
        times: list[float] = []
        t_end = time.perf_counter() + seconds
        while len(times) < 3 or time.perf_counter() < t_end:
            t0 = time.perf_counter()
            matmul(x, m, out)
            times.append((time.perf_counter() - t0) * 1e6)
        res[r] = statistics.median(times)
    return res


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, prepare or run the comparison, print and write it."""
    ap = argparse.ArgumentParser(prog="python -m bench.quant_matmul", description=__doc__)
    ap.add_argument("--prepare", action="store_true", help="only write the weights' cache")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--rows", default="1,4,512")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--seconds", type=float, default=0.15, help="timing per point and side")
    ap.add_argument("--threads", type=int, default=THREADS, help="threads of both sides")
    args = ap.parse_args(argv)
    todo = [c for c in cases(args.types.split(",")) if c[1] in args.shapes.split(",")]
    prepare(todo)
    if args.prepare:
        return
    rows = [int(r) for r in args.rows.split(",")]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"quant_matmul_{time.strftime('%Y-%m-%d_%H%M%S', time.gmtime())}.json"
    results: list[dict[str, Any]] = []
    for t, shape, n, k in todo:
        mine = ours(t, n, k, rows, args.seconds, args.threads)
        peer = theirs(t, n, k, rows, args.seconds, args.threads)
        for r in rows:
            ratio = peer[r]["us"] / mine[r]
            results.append({"type": t, "shape": shape, "n": n, "k": k, "rows": r,
                            "ours_us": round(mine[r], 2), "llama_us": peer[r]["us"],
                            "llama_repacked": bool(peer[r]["repacked"]),
                            "ratio": round(ratio, 3)})  # fmt: skip
            print(f"{t:8s} {shape:12s} M={r:<4d} ours {mine[r]:9.1f} us  llama.cpp "
                  f"{peer[r]['us']:9.1f} us{' (repacked)' if peer[r]['repacked'] else ''}  "
                  f"x{ratio:.2f}", flush=True)  # fmt: skip
        # after every case: a run cut short keeps what it measured
        _write(out, results, rows, args.threads)
    print("geometric mean over shapes of llama.cpp's time / ours:")
    for t, v in _summary(results, rows).items():
        print(f"  {t:8s} " + "  ".join(f"M={r}: x{x:.2f}" for r, x in v.items()))
    print(f"wrote {out}")


def _summary(results: list[dict[str, Any]], rows: list[int]) -> dict[str, dict[str, float]]:
    summary: dict[str, dict[str, float]] = {}
    for t in dict.fromkeys(x["type"] for x in results):
        for r in rows:
            v = [x["ratio"] for x in results if x["type"] == t and x["rows"] == r]
            if v:
                summary.setdefault(t, {})[str(r)] = round(statistics.geometric_mean(v), 3)
    return summary


def _write(out: Path, results: list[dict[str, Any]], rows: list[int], threads: int) -> None:
    from bench.servers import machine, machine_load

    out.write_text(json.dumps({"threads": threads, "machine": machine(), "load": machine_load(),
                               "summary": _summary(results, rows), "results": results},
                              indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
