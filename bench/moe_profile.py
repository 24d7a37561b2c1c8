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


def output_bytes(decoder: Any) -> int:
    """The bytes of the output matrix (``output.weight``, or the tied embedding) as stored."""
    from loraserve.model.projection import Projection

    for mod in decoder.modules():
        if isinstance(mod, Projection) and not mod.name.startswith("blk."):
            if mod.name in ("output.weight", "token_embd.weight"):
                return sum(p.data.numel() * p.data.element_size() for p in mod.parts)
    return 0


def profile(arch: str, threads: int, tokens: int, reps: int = 2) -> tuple[list[Rows], int]:
    """Per repetition: (label, seconds per decode token, calls per token), largest first;
    and the output matrix's bytes."""
    from loraserve.model.loader import load_model

    m = load_model(synth_model(arch, 4, None))
    meter = Meter()
    instrument(m.decoder, meter)
    rows = decode_profile(m, meter, threads, tokens, n_ctx=2048, reps=reps)
    return rows, output_bytes(m.decoder)


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.moe_profile [ARCH] [--threads N] [--tokens N]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.moe_profile", description=__doc__)
    ap.add_argument("arch", nargs="?", default="qwen3moe", choices=list(SHAPES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args(argv)
    reps, nbytes = profile(args.arch, args.threads, args.tokens)
    print_rows(args.arch, reps)
    labels = ("mm output.weight", "mm token_embd.weight")
    for i, rows in enumerate(reps):
        secs = next((r[1] for r in rows if r[0] in labels), 0.0)
        if nbytes and secs > 0:
            print(f"output matrix, repetition {i + 1}: {nbytes / 1e6:.0f} MB in "
                  f"{secs * 1e3:.2f} ms thread CPU = {nbytes / secs / 1e9:.1f} GB/s")  # fmt: skip


if __name__ == "__main__":
    main()
