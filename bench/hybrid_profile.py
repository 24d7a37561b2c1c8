"""Where a decode step of a hybrid bench model spends its time, per stage (issue 28).

`python -m bench.hybrid_profile [qwen35|granitehybrid] [--threads 1] [--tokens 16] [--reps 2]
[--paths]` loads the `bench.hybrid_synth` model in-process, runs one request of `--tokens` + 1
greedy tokens and one of 1 token on the same 64-token prompt (cache off), and prints, per
decode token (the difference of the two), the time in each quantized projection (by tensor
name), the recurrent kernels (`gdn_recur`, `gdn_step`, `scan2`, `mamba2_step`), the recurrent
mixers and the layers as a whole, or the fused C layers (`kernels.layers`: granitehybrid's
decode steps) as one stage; what the layers and the output leave is the engine's step
(embedding, sampling, state bookkeeping). `--paths` alternates the fused and the per-layer
path, repetition by repetition, so the two are compared under the same load. Times are the
calling thread's CPU time (`bench.stage_profile`): compare runs at 1 thread. Not a speed figure
against llama-server (that is `bench.hybrid_speed`, in a quiet window): a way to see which
stage a change moved.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.hybrid_synth import REAL, synth_model
from bench.stage_profile import Meter, Rows, decode_profile, print_rows, wrap_projections


def instrument(decoder: Any, meter: Meter) -> None:
    """Wrap the projections' kernel calls, the recurrent kernels, the mixers and the layers."""
    from loraserve.kernels import deltanet, ssm_scan
    from loraserve.kernels.layers import FusedLayers

    wrap_projections(decoder, meter)
    FusedLayers.__call__ = meter.wrap(  # type: ignore[method-assign]
        FusedLayers.__call__, "fused layers (C)"
    )
    deltanet.gdn_recur = meter.wrap(deltanet.gdn_recur, "gdn_recur")  # type: ignore[assignment]
    deltanet.gdn_step = meter.wrap(deltanet.gdn_step, "gdn_step")  # type: ignore[assignment]
    ssm_scan.scan2 = meter.wrap(ssm_scan.scan2, "ssm scan2")  # type: ignore[assignment]
    ssm_scan.mamba2_step = meter.wrap(  # type: ignore[assignment]
        ssm_scan.mamba2_step, "mamba2 step (C)"
    )
    for blk in decoder.blocks:
        if blk.mixer is not None:
            blk.mixer.forward = meter.wrap(blk.mixer.forward, "recurrent mixers (all)")
        blk.forward = meter.wrap(blk.forward, "layers (all)")


def profile(arch: str, threads: int, tokens: int, reps: int = 2,
            paths: bool = False) -> list[tuple[str, Rows]]:  # fmt: skip
    """Per repetition: its path and its (label, seconds per decode token, calls per token)
    rows, largest first; with `paths`, the fused and the per-layer path in turn."""
    from loraserve.model.loader import load_model

    m = load_model(synth_model(arch))
    meter = Meter()
    instrument(m.decoder, meter)
    out = []
    for r in range(reps if paths else 1):
        m.decoder.use_fused = not (paths and r % 2)
        label = "fused" if m.decoder.use_fused else "per-layer"
        n = 1 if paths else reps
        out += [(label, rows) for rows in decode_profile(m, meter, threads, tokens, 4096, n)]
    m.decoder.use_fused = True
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.hybrid_profile [ARCH] [--threads N] [--tokens N]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.hybrid_profile", description=__doc__)
    ap.add_argument("arch", nargs="?", default="qwen35", choices=list(REAL))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--paths", action="store_true", help="fused and per-layer paths in turn")
    args = ap.parse_args(argv)
    for label, rows in profile(args.arch, args.threads, args.tokens, args.reps, args.paths):
        print_rows(f"{args.arch} ({label})", [rows], width=32)


if __name__ == "__main__":
    main()
