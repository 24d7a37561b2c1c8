"""Decode speed of loraserve against llama-server, the two servers' runs interleaved:
`python -m bench.decode_ab [--archs qwen35,granitehybrid] [--rounds 6] [--n-predict 64]
[--scan-form recurrent|chunked]` (loraserve's scans; llama-server has one form).

`bench.hybrid_speed` runs one server after the other, so a run's decode ratio also holds
how much memory bandwidth the machine gave each server in its minutes: on a shared VM that
moved single figures by up to 30% between back-to-back runs (2026-12-04: llama-server's
lfm2 decode 71.8 then 59.1 tok/s, code unchanged), and decode is bandwidth-bound on both
servers. Here both servers are started on the same `bench.hybrid_synth` model and held
(idle: neither computes while the other runs; the meter below says what else ran), then
each round decodes one stream on each, the order alternating (llama-server first in even
rounds): S2 of `bench.scenarios`, `--n-predict` tokens after a 128-token prompt, same flags
as `bench.hybrid_speed` (`-t 2 -np 1 -c 4096 --cache-ram 8192`). Prints per arch the median
tok/s of each server, the per-round ratios (loraserve / llama-server, each round's two runs
a minute or less apart) and their median; writes `bench/results/decode_ab_<ts>.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.arch_speed import encoder
from bench.hybrid_synth import DEFAULT_LAYERS, REAL, synth_model
from bench.scenarios import Target, s2_decode, warm_up
from bench.servers import (
    CpuMeter,
    ServerKind,
    free_port,
    launch,
    loraserve_kind,
    machine,
    machine_load,
    peer_kind,
    server_argv,
)

RESULTS = Path(__file__).parent / "results"


def rounds(
    kinds: list[ServerKind], model: Path, vocab: int, n_rounds: int, n_predict: int,
    threads: int = 2,
) -> dict[str, Any]:  # fmt: skip
    """Both servers held on `model`; `n_rounds` rounds of one decode on each, alternating."""
    with ExitStack() as stack:
        targets, pids = {}, []
        for kind in kinds:
            port = free_port()
            argv = server_argv(kind, model, port, threads=threads, parallel=1, ctx=4096,
                               cache_ram=8192)  # fmt: skip
            srv = stack.enter_context(launch(kind.name, argv, port, 600.0))
            targets[kind.name] = Target(srv.url, 0, encoder(vocab), (), time.monotonic() + 3600)
            pids.append(srv.proc.pid)
            warm_up(targets[kind.name])
        names = [k.name for k in kinds]
        runs: dict[str, list[float]] = {n: [] for n in names}
        ratios, other = [], []
        for r in range(n_rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                meter = CpuMeter(pids[names.index(name)])
                dec = s2_decode(targets[name], 128, n_predict, reps=1, cap=600)
                other.append(meter.other_cores())
                runs[name].append(dec["decode_tok_s"])
            ratios.append(runs[names[1]][-1] / runs[names[0]][-1])
            print(f"decode_ab: round {r + 1}: " + ", ".join(
                f"{n} {runs[n][-1]:.2f}" for n in names) + f" tok/s, ratio {ratios[-1]:.2f}",
                file=sys.stderr)  # fmt: skip
    return {"tok_s": runs, "median_tok_s": {n: statistics.median(v) for n, v in runs.items()},
            "ratios": ratios, "median_ratio": statistics.median(ratios),
            "other_cores_max": max(other)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, run every arch, print and write the results."""
    from bench.peer import find_peer

    ap = argparse.ArgumentParser(prog="python -m bench.decode_ab", description=__doc__)
    ap.add_argument("--archs", default="qwen35,granitehybrid", help="comma list")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--scan-form", choices=("recurrent", "chunked"), default="recurrent",
                    help="loraserve's --scan-form (delta-net and Mamba-2 scans)")  # fmt: skip
    args = ap.parse_args(argv)
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    if unknown := set(archs) - set(REAL):
        ap.error(f"unknown arch(s) {sorted(unknown)}; known: {', '.join(REAL)}")
    if args.rounds < 1 or args.n_predict < 1:
        ap.error("--rounds and --n-predict must be at least 1")
    peer = find_peer()
    if peer is None:
        sys.exit("decode_ab: no llama-server (python -m bench.peer --build)")
    kinds = [peer_kind(peer), loraserve_kind(["--scan-form", args.scan_form])]
    res: dict[str, Any] = {"meta": {"timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
                                    "machine": machine(), "load_before": machine_load(),
                                    "rounds": args.rounds, "n_predict": args.n_predict,
                                    "threads": args.threads, "scan_form": args.scan_form},
           "models": {}}  # fmt: skip
    for arch in archs:
        vocab = REAL[arch][3]
        path = synth_model(arch, DEFAULT_LAYERS[arch], vocab)
        res["models"][arch] = rounds(kinds, path, vocab, args.rounds, args.n_predict,
                                     args.threads)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"decode_ab_{time.strftime('%Y-%m-%d_%H%M%S')}.json"
    out.write_text(json.dumps(res, indent=1))
    print("| model | llama-server tok/s (median) | loraserve tok/s (median) | ratio per round "
          "| median ratio | other cores (max) |\n|---|---|---|---|---|---|")  # fmt: skip
    for arch, m in res["models"].items():
        med = list(m["median_tok_s"].values())
        print(f"| {arch} | {med[0]:.2f} | {med[1]:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in m['ratios'])} | {m['median_ratio']:.2f}x | "
              f"{m['other_cores_max']:.3f} |")  # fmt: skip
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
