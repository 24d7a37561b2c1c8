"""Scenarios S1-S4 and S6 against one running server (S5 is in `chat.py`, S7 in `run.py`).

Every scenario takes a `Target` (the server and the workload's shared pieces), has a request
cap and a time cap, and returns a JSON-ready dict. All sampling is greedy.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.client import Completion, body, run_concurrent
from bench.workloads import (
    Encode,
    Mix,
    distinct_mixes,
    mix_lora,
    percentile,
    poisson_arrivals,
    prompt_tokens,
    zipf_choices,
)


@dataclass(frozen=True)
class Target:
    """A running server and what every scenario needs to build requests for it."""

    url: str
    n_adapters: int
    encode: Encode
    bos: tuple[int, ...]
    deadline: float

    def lora(self, mix: Mix) -> list[dict[str, float]] | None:
        """The explicit `lora` list for `mix` (all loaded ids), None without adapters."""
        return mix_lora(mix, self.n_adapters) if self.n_adapters else None

    def prompt(self, n: int, seed: int) -> list[int]:
        return prompt_tokens(self.encode, n, seed, prefix=self.bos)

    def cap(self, seconds: float) -> float:
        """`seconds`, shortened so the scenario ends before the run's deadline."""
        return max(1.0, min(seconds, self.deadline - time.monotonic()))


def _run(target: Target, payloads: list[dict[str, Any]], cap: float, **kw: Any):
    return asyncio.run(run_concurrent(target.url, payloads, time_cap=target.cap(cap), **kw))


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def warm_up(target: Target) -> None:
    """One short request, so lazy start-up work is not charged to the first scenario."""
    _run(target, [body(target.prompt(64, 7), 4, target.lora(()))], 60)


def s1_prefill(target: Target, n_prompt: int = 512, reps: int = 3, cap: float = 60) -> dict:
    """S1: prompt tokens per second on a `n_prompt`-token prompt, cache off, no adapter."""
    t_end, runs = time.monotonic() + cap, []
    for r in range(reps):
        if time.monotonic() > t_end:
            break
        payload = body(target.prompt(n_prompt, 100 + r), 1, target.lora(()), cache_prompt=False)
        (c,), _ = _run(target, [payload], cap)
        ttft = c.ttft or c.latency
        runs.append(
            {
                "client_tok_s": n_prompt / ttft if ttft else None,
                "server_tok_s": c.timings.get("prompt_per_second"),
                "prompt_n": c.timings.get("prompt_n"),
                "capped": c.done is None,
            }
        )
    return {
        "prefill_tok_s": _median([x["client_tok_s"] for x in runs]),
        "server_prefill_tok_s": _median([x["server_tok_s"] for x in runs]),
        "n_prompt": n_prompt,
        "runs": runs,
    }


def s2_decode(
    target: Target, n_prompt: int = 200, n_predict: int = 128, reps: int = 2, cap: float = 60
) -> dict:
    """S2: single-stream decode tokens per second after a `n_prompt`-token prompt."""
    t_end, runs = time.monotonic() + cap, []
    for r in range(reps):
        if time.monotonic() > t_end:
            break
        payload = body(target.prompt(n_prompt, 200 + r), n_predict, target.lora(()))
        (c,), _ = _run(target, [payload], cap)
        runs.append(
            {
                "client_tok_s": c.decode_rate,
                "server_tok_s": c.timings.get("predicted_per_second"),
                "n_tokens": c.n_tokens,
                "ttft_s": c.ttft,
                "capped": c.done is None,
            }
        )
    return {
        "decode_tok_s": _median([x["client_tok_s"] for x in runs]),
        "server_decode_tok_s": _median([x["server_tok_s"] for x in runs]),
        "runs": runs,
    }


def aggregate(
    target: Target, n_clients: int, n_mixes: int, n_predict: int = 48, cap: float = 45
) -> dict:
    """`n_clients` concurrent greedy streams over `n_mixes` distinct single-adapter mixes
    (0 = no adapter at all): aggregate tokens per second, first send to last token."""
    mixes: list[Mix] = distinct_mixes(n_mixes, target.n_adapters) if n_mixes else [()]
    payloads = [
        body(target.prompt(32, 300 + i), n_predict, target.lora(mixes[i % len(mixes)]))
        for i in range(n_clients)
    ]
    _run(target, [{**p, "n_predict": 2} for p in payloads], cap)
    results, wall = _run(target, payloads, cap)
    tokens = sum(c.n_tokens for c in results)
    return {
        "clients": n_clients,
        "mixes": n_mixes,
        "tokens": tokens,
        "wall_s": wall,
        "agg_tok_s": tokens / wall if wall > 0 else None,
        "finished": sum(c.done is not None for c in results),
        "capped": any(c.done is None for c in results),
    }


def s34_sweep(
    target: Target, plan: Sequence[tuple[int, int]], n_predict: int = 48, cap: float = 45
) -> list[dict]:
    """S3 (one shared mix) and S4 (all-distinct mixes), plus the points in between, for the
    plot: one `aggregate` run per (clients, mixes) in `plan` until the deadline."""
    points = []
    for clients, mixes in plan:
        if time.monotonic() + 5 > target.deadline:
            break
        points.append(aggregate(target, clients, mixes, n_predict, cap))
    return points


def _latency_stats(results: Sequence[Completion], wall: float) -> dict[str, Any]:
    done = [c for c in results if c.done is not None]
    lat = [c.latency for c in done if c.latency is not None]
    ttft = [c.ttft for c in done if c.ttft is not None]
    tokens = sum(c.n_tokens for c in results)
    return {
        "requests": len(results),
        "finished": len(done),
        "tokens": tokens,
        "wall_s": wall,
        "throughput_tok_s": tokens / wall if wall > 0 else None,
        "latency_p50_s": percentile(lat, 50),
        "latency_p95_s": percentile(lat, 95),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
    }


def s6_zipf(
    target: Target,
    n_adapters: int,
    *,
    n_requests: int = 24,
    rate: float = 1.0,
    n_predict: int = 32,
    cap: float = 60,
    seed: int = 6,
) -> dict:
    """S6: Poisson arrivals at `rate`/s, each request on one adapter drawn with Zipf
    popularity over `n_adapters` adapters: throughput and latency percentiles."""
    n_adapters = min(n_adapters, target.n_adapters)
    picks = zipf_choices(n_adapters, n_requests, seed)
    starts = poisson_arrivals(rate, n_requests, seed)
    payloads = [
        body(target.prompt(48, 600 + i), n_predict, target.lora(((a, 1.0),)))
        for i, a in enumerate(picks)
    ]
    results, wall = _run(target, payloads, cap, starts=starts)
    stats = _latency_stats(results, wall)
    return {"adapters": n_adapters, "distinct_used": len(set(picks)), "rate": rate, **stats}


def guarded(name: str, fn: Callable[[], Any], errors: dict[str, str]) -> Any:
    """Run one scenario; on failure record the error under `name` and return None."""
    try:
        return fn()
    except Exception as e:  # a broken scenario must not lose the others' results
        errors[name] = f"{type(e).__name__}: {e}"
        return None
