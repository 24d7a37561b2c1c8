"""`loraserve ray` against one server on the same cores: `python -m bench.ray_bench [--quick]`.

Three set-ups, one at a time, on the real model with 8 adapters (bench/workloads.py's, in
~/.cache/loraserve/bench-adapters): one `loraserve serve` with 2 threads, and 2 replicas x
1 core under `loraserve ray` with affinity routing and with round-robin. The same Poisson
stream of requests goes to each: every request picks an adapter by Zipf popularity and sends
that adapter's long shared prefix (its "system prompt") plus a short question of its own,
streamed, greedy. Reported per set-up: throughput (generated tokens/s, requests/s), p50/p95
latency, and the prompt tokens recomputed (evaluated, not found in a prefix cache) against
the prompt tokens sent. Writes `bench/results/ray_<timestamp>.json` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from bench.client import BenchError, Completion, body, stream_completion
from bench.servers import ServerKind, free_port, launch, loraserve_kind, machine, server_argv
from bench.workloads import (
    mix_lora,
    percentile,
    poisson_arrivals,
    sentence,
    write_adapters,
    zipf_choices,
)

MODEL = Path.home() / ".cache" / "loraserve" / "gemma3-270m-q4_k_m.gguf"
ADAPTERS = Path.home() / ".cache" / "loraserve" / "bench-adapters"
RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Plan:
    """The workload's sizes; `--quick` is a short check that everything runs."""

    n_adapters: int = 8
    requests: int = 160
    rate: float = 4.0  # requests per second (Poisson)
    prefix_sentences: int = 24  # the shared prefix of each adapter (~300 tokens)
    n_predict: int = 32
    parallel: int = 4  # -np of each server
    ctx: int = 8192
    time_cap: float = 600.0
    seed: int = 0

    @staticmethod
    def quick() -> Plan:
        return Plan(requests=12, rate=6.0, prefix_sentences=4, n_predict=4, time_cap=120.0)


def setups(plan: Plan) -> list[tuple[str, ServerKind, int]]:
    """(name, how to start it, threads per server) for the three set-ups."""
    ray = (sys.executable, "-m", "loraserve.cli", "ray")
    replicas = ("--replicas", "2", "--num-cpus-per-replica", "1")
    return [
        ("1 server x 2 cores", loraserve_kind(), 2),
        (
            "2 replicas x 1 core, affinity",
            ServerKind("loraserve-ray", ray, (*replicas, "--routing", "affinity")),
            1,
        ),  # fmt: skip
        (
            "2 replicas x 1 core, round-robin",
            ServerKind("loraserve-ray", ray, (*replicas, "--routing", "round_robin")),
            1,
        ),  # fmt: skip
    ]


def workload(plan: Plan) -> tuple[list[dict[str, Any]], list[float], list[int]]:
    """The request bodies, their arrival times and each one's adapter (Zipf over them)."""
    rng = random.Random(plan.seed)
    prefixes = [
        " ".join(sentence(rng) for _ in range(plan.prefix_sentences))
        for _ in range(plan.n_adapters)
    ]
    picks = zipf_choices(plan.n_adapters, plan.requests, plan.seed)
    payloads = []
    for i, a in enumerate(picks):
        prompt = f"{prefixes[a]}\nQuestion {i}: {sentence(rng, 8)}\nAnswer:"
        payload = body([], plan.n_predict, mix_lora(((a, 1.0),), plan.n_adapters))
        payload["prompt"] = prompt
        payloads.append(payload)
    return payloads, poisson_arrivals(plan.rate, plan.requests, plan.seed + 1), picks


async def send_all(
    url: str, payloads: list[dict[str, Any]], starts: list[float], time_cap: float
) -> tuple[list[Completion], list[str], float]:
    """Each payload at its arrival time, streamed; the completions, the errors and the wall
    time from the first send to the last token (unfinished ones are cut at ``time_cap``)."""
    results = [Completion(sent=0.0) for _ in payloads]
    errors: list[str] = []
    limits = httpx.Limits(max_connections=len(payloads) + 4)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(time_cap + 30)) as client:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, t0 + starts[i] - time.perf_counter()))
            results[i].sent = time.perf_counter()
            try:
                await stream_completion(client, url, payloads[i], results[i])
            except (BenchError, httpx.HTTPError) as e:
                errors.append(str(e))

        tasks = [asyncio.create_task(one(i)) for i in range(len(payloads))]
        _, pending = await asyncio.wait(tasks, timeout=time_cap)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    ends = [r.last or r.sent for r in results if r.sent]
    return results, errors, (max(ends) - t0) if ends else 0.0


def measure(url: str, plan: Plan) -> dict[str, Any]:
    """Send the workload to ``url``; the numbers of one set-up."""
    payloads, starts, picks = workload(plan)
    results, errors, wall = asyncio.run(send_all(url, payloads, starts, plan.time_cap))
    done = [r for r in results if r.done is not None]
    latencies = [r.latency for r in done if r.latency is not None]
    evaluated = sum(r.timings.get("prompt_n", 0) for r in done)
    cached = sum(r.timings.get("cache_n", 0) for r in done)
    generated = sum(r.n_tokens for r in done)
    return {
        "finished": len(done),
        "requests": len(results),
        "wall_s": wall,
        "tokens_per_s": generated / wall if wall else None,
        "requests_per_s": len(done) / wall if wall else None,
        "p50_s": percentile(latencies, 50),
        "p95_s": percentile(latencies, 95),
        "prompt_tokens_sent": evaluated + cached,
        "prompt_tokens_recomputed": evaluated,
        "adapter_counts": [picks.count(a) for a in range(plan.n_adapters)],
        "errors": sorted(set(errors))[:5],
    }


def run(plan: Plan, model: Path) -> list[dict[str, Any]]:
    """Every set-up, one after the other, on a fresh server each."""
    adapters = write_adapters(ADAPTERS, plan.n_adapters)
    rows = []
    for name, kind, threads in setups(plan):
        port = free_port()
        argv = server_argv(
            kind, model, port, threads=threads, parallel=plan.parallel, ctx=plan.ctx,
            cache_ram=-1, adapters=adapters,
        )  # fmt: skip
        print(f"{name}: {' '.join(argv)}", file=sys.stderr)
        with launch(kind.name, argv, port, timeout=300) as server:
            row = {"setup": name, "startup_s": server.startup_s, **measure(server.url, plan)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the set-ups."""

    def f(v: Any, digits: int = 2) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    out = [
        "| set-up | tok/s | req/s | p50 s | p95 s | prompt tokens recomputed / sent | finished |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = r["prompt_tokens_recomputed"] / max(1, r["prompt_tokens_sent"])
        out.append(
            f"| {r['setup']} | {f(r['tokens_per_s'], 1)} | {f(r['requests_per_s'])} "
            f"| {f(r['p50_s'])} | {f(r['p95_s'])} | {r['prompt_tokens_recomputed']} / "
            f"{r['prompt_tokens_sent']} ({share:.0%}) | {r['finished']}/{r['requests']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Run the three set-ups and write the results."""
    ap = argparse.ArgumentParser(prog="python -m bench.ray_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a short check that it all runs")
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--requests", type=int, help="override the plan's number of requests")
    ap.add_argument("--rate", type=float, help="override the plan's requests per second")
    args = ap.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    if args.requests:
        plan = replace(plan, requests=args.requests)
    if args.rate:
        plan = replace(plan, rate=args.rate)
    rows = run(plan, args.model)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y-%m-%d_%H%M%S")
    path = RESULTS / f"ray_{stamp}{'_quick' if args.quick else ''}.json"
    path.write_text(
        json.dumps({"plan": asdict(plan), "machine": machine(), "rows": rows}, indent=1)
    )
    print(table(rows))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
