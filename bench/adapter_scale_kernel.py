"""The LoRA kernel alone on many adapters: `python -m bench.adapter_scale_kernel [--lib X.so]`.

`ls_lora16` (`kernels/lora16.c`) over Gemma 3 270M's 126 LoRA targets (18 layers x 7
projections) for one decode step of `--rows` rows, with 16 random rank-8/16 float16 adapters
in memory: every row on one adapter, on 8 distinct, on 4, a Zipf-like mix of 5, and 8 distinct
with the rank-16 ones first (a split of the rows by count gives one thread twice the
other's work). The L3 is flushed between steps (a real step streams ~200 MB of base weights
between two uses of an adapter). Prints the median and minimum ms a step per case and
library: the package's own build, then each ``--lib`` (a kernels library built from another
checkout, e.g. the one before a change), interleaved, their outputs checked bitwise against
the first's. Wall clock (`--clock thread` for the calling thread's CPU time, one thread
only). Python's call overhead (~4 us a call) is in every figure alike.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from collections.abc import Callable

import torch

from loraserve.cbuild import bind
from loraserve.kernels.lora16 import _SIGNATURES, tail, tiles

# (in, out) of Gemma 3 270M's q, k, v, o, gate, up, down
SHAPES = [(640, 1024), (640, 256), (640, 256), (1024, 640), (640, 2048), (640, 2048), (2048, 640)]
LAYERS = 18


def _cases(t: int) -> dict[str, list[int]]:
    return {
        "1 adapter r8": [0] * t,
        "1 adapter r16": [1] * t,
        "8 adapters": [i % 8 for i in range(t)],
        "4 adapters": [i % 4 for i in range(t)],
        "Zipf-like 5": ([0, 0, 0, 1, 2, 0, 3, 5] * t)[:t],
        "8, r16 first": ([1, 3, 5, 7, 0, 2, 4, 6] * t)[:t],  # ranks 16 x 4, then 8 x 4
    }


def _lib(path: str | None) -> Callable[..., int]:
    if path is None:
        lib = bind(_SIGNATURES)
        if lib is None:
            raise SystemExit("no compiled kernels here")
        return lib.ls_lora16
    f = ctypes.CDLL(path).ls_lora16
    f.argtypes, f.restype = _SIGNATURES["ls_lora16"]
    return f


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.adapter_scale_kernel", description=__doc__)
    ap.add_argument("--lib", action="append", default=[], help="another kernels .so to compare")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall")
    args = ap.parse_args(argv)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    torch.manual_seed(0)
    libs = [("this build", _lib(None))] + [(p, _lib(p)) for p in args.lib]
    t = args.rows

    def adapter(r: int, k: int, n: int) -> tuple[torch.Tensor, ...]:
        a, b = (torch.randn(r, k) * 0.05).half(), (torch.randn(n, r) * 0.05).half()
        return a.contiguous(), tiles(b), tail(b)

    ads = [[[adapter(8 + 8 * (i % 2), k, n) for k, n in SHAPES] for _ in range(LAYERS)]
           for i in range(16)]  # fmt: skip
    xs = [torch.randn(t, k) for k, _ in SHAPES]
    flush = torch.zeros(64 * 2**20 // 4)
    P = ctypes.c_void_p

    def calls(rows: list[int]) -> list[tuple[tuple, torch.Tensor]]:
        used = sorted(set(rows))
        sc = torch.zeros(len(used), t)
        for row, a in enumerate(rows):
            sc[used.index(a), row] = 0.5 + 0.1 * row
        out = []
        for layer in range(LAYERS):
            for p, (k, n) in enumerate(SHAPES):
                items = [ads[a][layer][p] for a in used]
                m = len(items)

                def ptrs(ts: list[torch.Tensor], m: int = m) -> ctypes.Array:
                    return (P * m)(*[x.data_ptr() for x in ts])

                y = torch.zeros(t, n)
                argv_c = (m, ptrs([i[0] for i in items]), ptrs([i[2] for i in items]),
                          ptrs([i[1] for i in items]),
                          (ctypes.c_int64 * m)(*[i[0].shape[0] for i in items]), sc.data_ptr(),
                          xs[p].data_ptr(), k, t, k, y.data_ptr(), n, n, args.threads)  # fmt: skip
                out.append((argv_c, y))
        out.append(((), sc))  # keeps the scales alive
        return out

    prepared = {name: calls(rows) for name, rows in _cases(t).items()}
    times: dict[tuple[int, str], list[float]] = {}
    first: dict[str, torch.Tensor] = {}
    for _ in range(args.repeats):
        for li, (_, fn) in enumerate(libs):
            for name, cl in prepared.items():
                work = [(a, y) for a, y in cl if a]
                for _, y in work:
                    y.zero_()
                flush.add_(1.0)
                t0 = clock()
                for a, _ in work:
                    fn(*a)
                times.setdefault((li, name), []).append(1e3 * (clock() - t0))
                out = torch.cat([y.flatten() for _, y in work])
                if name not in first:
                    first[name] = out.clone()
                elif not torch.equal(first[name], out):
                    raise SystemExit(f"{libs[li][0]}: {name} differs from the first library's bits")
    print(f"ms a step ({args.clock}), {t} rows, {args.threads} threads, median (min):")
    for name in prepared:
        cells = [f"{statistics.median(times[(li, name)]):.2f} ({min(times[(li, name)]):.2f})"
                 for li in range(len(libs))]  # fmt: skip
        print(f"  {name:14s} " + "  ".join(f"{libs[li][0]}: {c}" for li, c in enumerate(cells)))


if __name__ == "__main__":
    main()
