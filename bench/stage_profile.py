"""Per-stage thread-CPU time of a decode step, shared by `bench.hybrid_profile` and
`bench.moe_profile`.

A `Meter` wraps callables (a projection's kernel call, a layer's forward) and sums the calling
thread's CPU time (`time.thread_time`) under a label; `decode_profile` runs one request of
`tokens` + 1 greedy tokens and one of 1 token on the same 64-token prompt (cache off) and
reports each label's time per decode token, the difference of the two. Thread CPU time is
disturbed far less by a loaded machine than wall time, but the kernels' other threads are
not counted: compare runs at 1 thread.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import torch

Totals = tuple[float, dict[str, float], dict[str, int]]
Rows = list[tuple[str, float, float]]  # (label, seconds per decode token, calls per token)


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


def wrap_projections(decoder: Any, meter: Meter) -> None:
    """Every quantized projection's kernel call timed as ``mm <tensor name>`` (the block
    prefix dropped; the output matrix under its own name)."""
    from loraserve.kernels import parts
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


def decode_profile(model: Any, meter: Meter, threads: int, tokens: int, n_ctx: int,
                   reps: int = 2) -> list[Rows]:  # fmt: skip
    """Per repetition: rows of (label, seconds per decode token, calls per token), largest
    first, the first row the whole decode step; `model` loaded and instrumented on `meter`."""
    from loraserve.engine.core import EngineConfig
    from loraserve.engine.engine import Engine
    from loraserve.engine.sampling.params import SamplingParams

    torch.set_num_threads(threads)
    eng = Engine(model, EngineConfig(n_slots=1, n_ctx=n_ctx))
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


def print_rows(arch: str, reps: list[Rows], width: int = 36) -> None:
    """Each repetition's rows in milliseconds per decode token."""
    for i, rows in enumerate(reps):
        print(f"{arch}, repetition {i + 1}: thread CPU ms per decode token")
        for label, secs, calls in rows:
            print(f"  {label:{width}s} {secs * 1e3:8.3f}  ({calls:.1f} calls)")
