"""Quick side-by-side of the two speed targets only: `python -m bench.ab [--rounds N]`.

S2 (single-stream decode) and S4 (4 clients x 4 distinct mixes, and 8 x 8) against
loraserve and llama-server, alternating servers for N rounds (never both at once), so
that drift of this shared machine's speed hits both sides; prints each round's ratios.
The full table comes from `python -m bench.run`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.peer import find_peer
from bench.run import Plan, Setup, _argv, _setup
from bench.scenarios import Target, aggregate, s2_decode, warm_up
from bench.servers import ServerKind, free_port, launch, loraserve_kind, peer_kind


def _one(kind: ServerKind, setup: Setup) -> dict[str, float]:
    port = free_port()
    argv = _argv(kind, setup, port, parallel=8, ctx=8192, cache_ram=2048, adapters=setup.adapters)
    with launch(kind.name, argv, port) as srv:
        t = Target(srv.url, len(setup.adapters), setup.encode, setup.bos, time.monotonic() + 600)
        warm_up(t)
        out = {"s2": s2_decode(t)["decode_tok_s"]}
        for clients, mixes in ((4, 4), (8, 8)):
            out[f"{clients}x{mixes}"] = aggregate(t, clients, mixes)["agg_tok_s"]
    return out


def main() -> None:
    """Run the alternating rounds and print the ratios."""
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from loraserve.model.default import default_model_path

    setup = _setup(default_model_path(), Plan())
    binary = find_peer()
    if binary is None:
        sys.exit("llama-server not found: run `python -m bench.run --build-peer` once")
    kinds = [loraserve_kind(), peer_kind(binary)]
    ratios: dict[str, list[float]] = {}
    for r in range(args.rounds):
        res = {k.name: _one(k, setup) for k in kinds}
        ours, peer = res["loraserve"], res["llama-server"]
        line = []
        for key in ours:
            ratios.setdefault(key, []).append(ours[key] / peer[key])
            line.append(f"{key} {ours[key]:.1f}/{peer[key]:.1f}={ours[key] / peer[key]:.2f}")
        print(f"round {r + 1}: " + "  ".join(line), flush=True)
    print(
        "median ratios: " + "  ".join(f"{k} {statistics.median(v):.2f}" for k, v in ratios.items())
    )


if __name__ == "__main__":
    main()
