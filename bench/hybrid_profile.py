"""Where a decode step of a hybrid bench model spends its time, per stage (issue 28).

`python -m bench.hybrid_profile [qwen35|granitehybrid] [--threads 1] [--tokens 16]` loads the
`bench.hybrid_synth` model in-process, runs one request of `--tokens` + 1 greedy tokens and one
of 1 token on the same 64-token prompt (cache off), and prints, per decode token (the
difference of the two), the time in each quantized projection (by tensor name), the
recurrent kernels (`gdn_recur`, `scan2`), the recurrent mixers and the layers as a whole;
what the layers and the output leave is the engine's step (embedding, sampling, state
bookkeeping). Times are the calling thread's CPU time (`time.thread_time`), which a loaded
machine disturbs far less than wall time; with `--threads` above 1 the kernels' other
threads are not counted, so compare runs at 1 thread. Not a speed figure against llama-server
(that is `bench.hybrid_speed`, in a quiet window): a way to see which stage a change moved.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import torch

from bench.hybrid_synth import REAL, synth_model

Totals = tuple[float, dict[str, float], dict[str, int]]


class Meter:
    """Thread-CPU seconds and calls per label, from wrapped callables."""

    def __init__(self) -> None:
        self.secs: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def wrap(self, fn: Callable[..., Any], label: str | Callable[..., str]) -> Callable[..., Any]:
        """`fn` timed under `label` (or `label(*args)`)."""

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                name = label if isinstance(label, str) else label(*a)
                self.secs[name] += time.thread_time() - t0
                self.calls[name] += 1

        return timed


def instrument(decoder: Any, meter: Meter) -> None:
    """Wrap the projections' kernel calls, the recurrent kernels, the mixers and the layers."""
    from loraserve.kernels import deltanet, parts, ssm_scan
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
    deltanet.gdn_recur = meter.wrap(deltanet.gdn_recur, "gdn_recur")  # type: ignore[assignment]
    ssm_scan.scan2 = meter.wrap(ssm_scan.scan2, "ssm scan2")  # type: ignore[assignment]
    for blk in decoder.blocks:
        if blk.mixer is not None:
            blk.mixer.forward = meter.wrap(blk.mixer.forward, "recurrent mixers (all)")
        blk.forward = meter.wrap(blk.forward, "layers (all)")


def profile(arch: str, threads: int, tokens: int, reps: int = 2) -> list[list[tuple]]:
    """Per repetition: (label, ms per decode token, calls per token) rows, largest first."""
    from loraserve.engine.core import EngineConfig
    from loraserve.engine.engine import Engine
    from loraserve.engine.sampling.params import SamplingParams
    from loraserve.model.loader import load_model

    torch.set_num_threads(threads)
    m = load_model(synth_model(arch))
    meter = Meter()
    instrument(m.decoder, meter)
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=4096))
    prompt = [(i * 7919) % 4000 + 4 for i in range(64)]

    def run(n: int) -> Totals:
        meter.secs.clear()
        meter.calls.clear()
        t0 = time.thread_time()
        sub = eng.submit(prompts=[prompt], sampling=SamplingParams(temperature=0.0),
                         max_tokens=n, cache_prompt=False)  # fmt: skip
        eng.run_until_idle()
        assert all(r.events.qsize() for r in sub.requests)
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
    """`python -m bench.hybrid_profile [ARCH] [--threads N] [--tokens N]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.hybrid_profile", description=__doc__)
    ap.add_argument("arch", nargs="?", default="qwen35", choices=list(REAL))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args(argv)
    for i, rows in enumerate(profile(args.arch, args.threads, args.tokens)):
        print(f"{args.arch}, repetition {i + 1}: thread CPU ms per decode token")
        for label, secs, calls in rows:
            print(f"  {label:32s} {secs * 1e3:8.3f}  ({calls:.1f} calls)")


if __name__ == "__main__":
    main()
