"""Where a decode step of an `arch_speed` MoE model spends its time, per stage (issue 27).

`python -m bench.moe_profile [qwen3moe|gpt-oss|deepseek2] [--threads 1] [--tokens 16]` loads
the 4-layer `bench.synth_archs` model in-process and, as `bench.hybrid_profile` does, prints
per decode token (a request of `--tokens` + 1 greedy tokens less one of 1 token, same
64-token prompt, cache off) the thread-CPU time of each quantized projection (by tensor
name; the output matrix apart), the routed experts' grouped call, the MoE layers and
latent attention as a whole, the attention kernel and the layers; what the layers and the
output leave is the engine's step (embedding, sampling, bookkeeping). Thread CPU time
(`time.thread_time`); compare runs at 1 thread. Not a figure against llama-server (that is
`bench.arch_speed`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from bench.hybrid_profile import Meter
from bench.synth_archs import SHAPES, synth_model


def instrument(decoder: Any, meter: Meter) -> None:
    """Wrap the projections' kernel calls, the grouped experts, the MoE and latent-attention
    layers, the attention kernel and the layers."""
    from loraserve.kernels import attention, moe, parts
    from loraserve.model.attn import mla, paged
    from loraserve.model.projection import Projection

    names = {}
    for mod in decoder.modules():
        if isinstance(mod, Projection) and mod._qparts is not None:
            blk = mod.name.startswith("blk.")
            names[id(mod._qparts)] = mod.name.split(".", 2)[-1] if blk else mod.name
    call = parts.QuantizedParts.__call__
    parts.QuantizedParts.__call__ = meter.wrap(  # type: ignore[method-assign]
        call, lambda self, *_: "mm " + names.get(id(self), "?")
    )
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


def profile(arch: str, threads: int, tokens: int, reps: int = 2) -> list[list[tuple]]:
    """Per repetition: (label, seconds per decode token, calls per token), largest first."""
    from loraserve.engine.core import EngineConfig
    from loraserve.engine.engine import Engine
    from loraserve.engine.sampling.params import SamplingParams
    from loraserve.model.loader import load_model

    torch.set_num_threads(threads)
    m = load_model(synth_model(arch, 4, None))
    meter = Meter()
    instrument(m.decoder, meter)
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=2048))
    prompt = [(i * 7919) % 4000 + 4 for i in range(64)]

    def run(n: int) -> tuple[float, dict[str, float], dict[str, int]]:
        meter.secs.clear()
        meter.calls.clear()
        t0 = time.thread_time()
        eng.submit(prompts=[prompt], sampling=SamplingParams(temperature=0.0), max_tokens=n,
                   cache_prompt=False)  # fmt: skip
        eng.run_until_idle()
        return time.thread_time() - t0, dict(meter.secs), dict(meter.calls)

    run(2)  # warm-up
    out = []
    for _ in range(reps):
        one, many = run(1), run(tokens + 1)
        rows = [("decode step (all)", (many[0] - one[0]) / tokens, 1.0)]
        for k in many[1]:
            secs = (many[1][k] - one[1].get(k, 0.0)) / tokens
            rows.append((k, secs, (many[2][k] - one[2].get(k, 0)) / tokens))
        out.append(sorted(rows, key=lambda r: -r[1]))
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.moe_profile [ARCH] [--threads N] [--tokens N]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.moe_profile", description=__doc__)
    ap.add_argument("arch", nargs="?", default="qwen3moe", choices=list(SHAPES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args(argv)
    for i, rows in enumerate(profile(args.arch, args.threads, args.tokens)):
        print(f"{args.arch}, repetition {i + 1}: thread CPU ms per decode token")
        for label, secs, calls in rows:
            print(f"  {label:36s} {secs * 1e3:8.3f}  ({calls:.1f} calls)")


if __name__ == "__main__":
    main()
