"""Where a decode step of an `arch_speed` MoE model spends its time, per stage (issue 27).

`python -m bench.moe_profile [qwen3moe|gpt-oss|deepseek2] [--threads 1] [--tokens 16]` loads
the 4-layer `bench.synth_archs` model in-process and, as `bench.hybrid_profile` does, prints
per decode token (a request of `--tokens` + 1 greedy tokens less one of 1 token, same
64-token prompt, cache off) the thread-CPU time of each quantized projection (by tensor
name; the output matrix apart), the routed experts' grouped call, the MoE layers and
latent attention as a whole, the attention kernel and the layers; what the layers and the
output leave is the engine's step (embedding, sampling, bookkeeping). Thread CPU time
(`bench.stage_profile`); compare runs at 1 thread. Not a figure against llama-server (that is
`bench.arch_speed`).
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.stage_profile import Meter, Rows, decode_profile, print_rows, wrap_projections
from bench.synth_archs import SHAPES, synth_model


def instrument(decoder: Any, meter: Meter) -> None:
    """Wrap the projections' kernel calls, the grouped experts, the MoE and latent-attention
    layers, the attention kernel and the layers."""
    from loraserve.kernels import attention, moe
    from loraserve.model.attn import mla, paged

    wrap_projections(decoder, meter)
    moe.GroupedExperts.ffn_rows = meter.wrap(  # type: ignore[method-assign]
        moe.GroupedExperts.ffn_rows, "routed experts (grouped C call)"
    )
    kernel = meter.wrap(attention.attention, "attention kernel")
    paged.attention = kernel  # type: ignore[assignment]
    mla.attention = kernel  # type: ignore[assignment]
    for blk in decoder.blocks:
        if blk.moe is not None:
            blk.moe.forward = meter.wrap(blk.moe.forward, "MoE layers (all)")
        if blk.mla is not None:
            blk.mla.forward = meter.wrap(blk.mla.forward, "latent attention (all)")
        blk.forward = meter.wrap(blk.forward, "layers (all)")


def profile(arch: str, threads: int, tokens: int, reps: int = 2) -> list[Rows]:
    """Per repetition: (label, seconds per decode token, calls per token), largest first."""
    from loraserve.model.loader import load_model

    m = load_model(synth_model(arch, 4, None))
    meter = Meter()
    instrument(m.decoder, meter)
    return decode_profile(m, meter, threads, tokens, n_ctx=2048, reps=reps)


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.moe_profile [ARCH] [--threads N] [--tokens N]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.moe_profile", description=__doc__)
    ap.add_argument("arch", nargs="?", default="qwen3moe", choices=list(SHAPES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args(argv)
    print_rows(args.arch, profile(args.arch, args.threads, args.tokens))


if __name__ == "__main__":
    main()
