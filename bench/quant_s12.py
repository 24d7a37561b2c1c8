"""S1 (prefill) and S2 (single-stream decode) alone, per model file, loraserve then
llama-server (never both at once): `python -m bench.quant_s12 [--model PATH ...] [--threads 2]`.

Issue 32's whole-model figures: the real model in Q4_K_M (the default) and requantized
(e.g. ~/.cache/loraserve/requant/gemma3-270m-IQ4_XS.gguf), on an 8-slot instance without
adapters (`-np 8 -c 8192 --cache-ram 2048 -t 2`; `--threads N`: -t N on both servers), S1/S2
as `bench.run` runs them (the same requests, the same medians). Short enough for a bench
window: about half a minute per model and server. Prints the ratios (ours / llama-server's
tok/s) and writes bench/results/quant_s12_<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.peer import find_peer
from bench.run import RESULTS, Plan, _argv, _setup
from bench.scenarios import Target, s1_prefill, s2_decode, warm_up
from bench.servers import (
    ServerKind,
    free_port,
    launch,
    loraserve_kind,
    machine,
    machine_load,
    peer_kind,
)


def one(kind: ServerKind, model: Path, quick: bool = False, threads: int = 2) -> dict[str, Any]:
    """S1 and S2 on one server started on `model` with `threads` (`quick`: one short request
    each, for checking the harness)."""
    quick_s2 = {"n_predict": 8, "reps": 1}
    plan = (Plan(n_adapters=0, s1_reps=1, s2=quick_s2, threads=threads) if quick
            else Plan(n_adapters=0, threads=threads))  # fmt: skip
    setup = _setup(model, plan)
    port = free_port()
    argv = _argv(kind, setup, port, parallel=8, ctx=8192, cache_ram=2048)
    out: dict[str, Any] = {"load_before": machine_load(), "threads": threads}
    with launch(kind.name, argv, port) as srv:
        t = Target(srv.url, 0, setup.encode, setup.bos, time.monotonic() + 300)
        warm_up(t)
        out["s1"] = s1_prefill(t, reps=setup.plan.s1_reps)
        out["s2"] = s2_decode(t, **setup.plan.s2)
    return out


def main(argv: list[str] | None = None) -> None:
    """Run S1/S2 for each model on both servers, print the ratios, write the results."""
    ap = argparse.ArgumentParser(prog="python -m bench.quant_s12", description=__doc__)
    ap.add_argument("--model", type=Path, action="append", help="GGUF (repeatable)")
    ap.add_argument("--quick", action="store_true", help="one short request each: a harness check")
    ap.add_argument("--threads", type=int, default=2, help="-t of both servers")
    args = ap.parse_args(argv)
    from loraserve.model.default import default_model_path

    models = args.model or [default_model_path()]
    binary = find_peer()
    if binary is None:
        sys.exit("llama-server not found: run `python -m bench.run --build-peer` once")
    runs: list[dict[str, Any]] = []
    for model in models:
        kinds = (loraserve_kind(), peer_kind(binary))
        res = {k.name: one(k, model, args.quick, args.threads) for k in kinds}
        ours, peer = res["loraserve"], res["llama-server"]
        pre = ours["s1"]["prefill_tok_s"] / peer["s1"]["prefill_tok_s"]
        dec = ours["s2"]["decode_tok_s"] / peer["s2"]["decode_tok_s"]
        print(f"{model.name}: prefill {ours['s1']['prefill_tok_s']:.0f} / "
              f"{peer['s1']['prefill_tok_s']:.0f} tok/s = {pre:.2f}x, decode "
              f"{ours['s2']['decode_tok_s']:.1f} / {peer['s2']['decode_tok_s']:.1f} tok/s = "
              f"{dec:.2f}x", flush=True)  # fmt: skip
        runs.append({"model": str(model), "prefill_ratio": pre, "decode_ratio": dec, **res})
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"quant_s12_{time.strftime('%Y-%m-%d_%H%M%S', time.gmtime())}.json"
    doc = {"machine": machine(), "threads": args.threads, "runs": runs}
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
