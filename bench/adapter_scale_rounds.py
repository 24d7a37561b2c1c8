"""`bench.adapter_scale`'s measurement: one server per adapter count, paired rounds in it.

A 96-request load lasts 10-20 s on this machine, and the single-adapter reference used to be
one such load on a server of its own, started before the others: it varied 191-300 tok/s
from run to run on a shared machine, so a ratio against it said more about when it ran than
about the adapters. Here every server (one per adapter count) serves, after a warm-up, R
rounds, each a single-adapter load (every request on `a0000`) and the Zipf load over the N
adapters back to back, in alternating order (even rounds single first, odd rounds Zipf
first, so a drift in the machine's load falls on both sides alike). Each round's ratio is
Zipf over single from the same server within seconds; the row reports the median.

Round 0's Zipf load is the first use of its adapters (every one read from disk: with 64
adapters and 96 requests ~34 first-use loads, a third of the requests); the later rounds
draw new Zipf picks (seed + round) from a server whose tier has seen the earlier ones, the
steady state that S-LoRA's figures describe. Both are reported: `ratio_first` (round 0) and
`ratio_steady` (median over rounds 1..R-1), beside `ratio_median` over all rounds.

Five rounds by default (three before): one round's ratio varies by up to ~8% on a quiet
machine, and with three the median was round 1's, a load still a sixth first uses.

Each load also records what explains a slow round: its first uses (adapters never sent
before: reads no tier policy avoids) beside `lru_reads` (the client-side LRU model's reads),
the share of the round's adapter files in the page cache as the Zipf load starts, the
server's system CPU and major page faults, and MemAvailable.

Every request has a prompt of its own (tagged with the round and side), so no round reads
the KV an earlier one left in the prefix cache.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.client import BenchError, Completion, stream_completion
from bench.servers import CLK_TCK, CpuMeter, Running, _proc_jiffies
from bench.workloads import percentile

METRICS = {
    "loads": "loraserve:lora_loads_total",
    "load_s": "loraserve:lora_load_seconds_total",
    "evictions": "loraserve:lora_evictions_total",
    "resident_bytes": "loraserve:lora_resident_bytes",
    "resident": "loraserve:lora_resident",
}


class TierModel:
    """An LRU model of the server's tier over the sends so far: was each request's adapter
    among the last `capacity` distinct adapters used before it (resident) or not (read)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.seen: set[int] = set()  # every adapter sent so far

    def feed(self, picks: list[int]) -> list[bool]:
        """Each pick's residency in send order; the model then holds them as used."""
        out = []
        self.seen.update(picks)
        for a in picks:
            out.append(a in self._lru)
            self._lru[a] = None
            self._lru.move_to_end(a)
            if len(self._lru) > self.capacity:
                self._lru.popitem(last=False)
        return out


async def closed_loop(url: str, payloads: list[dict[str, Any]], clients: int) -> tuple:
    """`clients` workers each send the next payload when their last one ends; returns the
    completions (in payload order), the errors and the wall time."""
    results = [Completion(sent=0.0) for _ in payloads]
    errors: list[str] = []
    queue = list(range(len(payloads)))[::-1]
    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600)) as client:
        t0 = time.perf_counter()

        async def worker() -> None:
            while queue:
                i = queue.pop()
                results[i].sent = time.perf_counter()
                try:
                    await stream_completion(client, url, payloads[i], results[i])
                except (BenchError, httpx.HTTPError) as e:
                    errors.append(str(e)[:200])

        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return results, errors, wall


def summarize(results: list[Completion], errors: list[str], wall: float,
              resident: list[bool]) -> dict[str, Any]:  # fmt: skip
    """Throughput and TTFT split by resident / read from disk."""
    done = [r for r in results if r.done is not None]
    ttft: dict[bool, list[float]] = {True: [], False: []}
    for r, warm in zip(results, resident, strict=True):
        if r.ttft is not None:
            ttft[warm].append(r.ttft)
    return {
        "finished": len(done),
        "requests": len(results),
        "wall_s": wall,
        "tokens_per_s": sum(r.n_tokens for r in done) / wall if wall else None,
        "ttft_resident": ttft[True],
        "ttft_cold": ttft[False],
        "errors": sorted(set(errors))[:5],
    }


def metrics(url: str) -> dict[str, float | None]:
    """The tier counters from the server's /metrics (None where absent: llama-server)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        text = ""
    out: dict[str, float | None] = dict.fromkeys(METRICS)
    for line in text.splitlines():
        for key, name in METRICS.items():
            if line.startswith(name + " "):
                out[key] = float(line.split()[1])
    return out


def _load(server: Running, payloads: list[dict[str, Any]], clients: int,
          resident: list[bool]) -> dict[str, Any]:  # fmt: skip
    """One closed-loop load on `server`, its tier counters' change and the other cores'
    use during it (the machine's share taken by processes other than the two sides)."""
    before = metrics(server.url)
    meter = CpuMeter(server.proc.pid)
    cpu0, sys0, flt0 = _proc_jiffies(server.proc.pid), *_sys_faults(server.proc.pid)
    out = {"mem_available_mib": _mem_available_mib()}
    out.update(summarize(*asyncio.run(closed_loop(server.url, payloads, clients)), resident))
    out["other_cores"] = meter.other_cores()
    out["server_cpu_s"] = (_proc_jiffies(server.proc.pid) - cpu0) / CLK_TCK
    sys1, flt1 = _sys_faults(server.proc.pid)
    out["server_sys_s"], out["major_faults"] = (sys1 - sys0) / CLK_TCK, flt1 - flt0
    after = metrics(server.url)
    for key in ("loads", "load_s", "evictions"):
        a, b = after[key], before[key]
        out[key] = None if a is None or b is None else a - b
    return out


def _sys_faults(pid: int) -> tuple[int, int]:
    """The server's system-mode CPU (jiffies) and major page faults so far: a read that
    waits for the disk faults, and memory short enough to reclaim shows as system time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    return int(fields[12]), int(fields[9])


def _mem_available_mib() -> float | None:
    """MemAvailable now (MiB): a page cache that cannot hold the adapters reads them anew."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return None


def _total(xs: list[float | None]) -> float | None:
    """The sum, or None where the server has no such counter (llama-server)."""
    return None if any(x is None for x in xs) or not xs else sum(xs)  # type: ignore[arg-type]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def rounds(
    server: Running,
    clients: int,
    repeats: int,
    warmup: list[dict[str, Any]],
    single: Callable[[int], tuple[list[dict[str, Any]], list[int]]] | None,
    multi: Callable[[int], tuple[list[dict[str, Any]], list[int]]],
    tier: TierModel,
    before_multi: Callable[[list[int]], dict[str, Any] | None] | None = None,
    mark: Callable[[str], object] | None = None,
    single16: Callable[[int], tuple[list[dict[str, Any]], list[int]]] | None = None,
) -> dict[str, Any]:
    """Warm-up, then `repeats` rounds of the single-adapter load and the Zipf load in
    alternating order; ``single(r)`` / ``multi(r)`` give round r's payloads and adapter
    picks (``single`` None: the Zipf loads alone, no ratio); ``mark`` names the moments
    (``warm``: the warm-up done, ``round r``) to a memory sampler. Returns the rounds, the
    medians and the pooled TTFTs of the Zipf loads. ``single16``: a second single-adapter
    load per round (the rank-16 adapter), run between the two."""
    if warmup:
        asyncio.run(closed_loop(server.url, warmup, clients))
        tier.feed([0] * len(warmup))
    if mark is not None:
        mark("warm")
    out_rounds = []
    for r in range(repeats):
        if mark is not None and r:
            mark(f"round {r}")
        sides: dict[str, dict[str, Any]] = {}
        order = ("single", "single16", "multi")[:: 1 if r % 2 == 0 else -1]
        loads = {"single": single, "single16": single16, "multi": multi}
        for side in (x for x in order if loads[x] is not None):
            payloads, picks = loads[side](r)  # type: ignore[misc]
            extra: dict[str, Any] = {"first_uses": len(set(picks) - tier.seen)}
            if side == "multi" and before_multi is not None:
                extra.update(before_multi(picks) or {})
            warm = tier.feed(picks)
            sides[side] = {**_load(server, payloads, clients, warm), **extra,
                           "lru_reads": warm.count(False)}  # fmt: skip
        s, m = sides.get("single", {}).get("tokens_per_s"), sides["multi"]["tokens_per_s"]
        ratio = m / s if s and m else None
        out_rounds.append({"round": r, "ratio": ratio, "cpu_ratio": _cpu_ratio(sides), **sides})
    ratios = [x["ratio"] for x in out_rounds if x["ratio"] is not None]
    multis = [x["multi"] for x in out_rounds]
    resident = [t for m in multis for t in m["ttft_resident"]]
    cold = [t for m in multis for t in m["ttft_cold"]]
    return {
        "tokens_per_s": _median([m["tokens_per_s"] for m in multis if m["tokens_per_s"]]),
        "single_tokens_per_s": _median(
            [
                x["single"]["tokens_per_s"]
                for x in out_rounds
                if x.get("single", {}).get("tokens_per_s")
            ]
        ),
        "ratio_median": _median(ratios),
        "ratio_first": out_rounds[0]["ratio"] if out_rounds else None,
        "ratio_steady": _median([x["ratio"] for x in out_rounds[1:] if x["ratio"] is not None]),
        "ratio_range": [min(ratios), max(ratios)] if ratios else None,
        "cpu_ratio_median": _median([x["cpu_ratio"] for x in out_rounds if x["cpu_ratio"]]),
        "ttft_resident_p50": percentile(resident, 50),
        "ttft_resident_p95": percentile(resident, 95),
        "ttft_cold_p50": percentile(cold, 50),
        "ttft_cold_p95": percentile(cold, 95),
        "n_cold": len(cold),
        "finished": sum(m["finished"] for m in multis),
        "requests": sum(m["requests"] for m in multis),
        **{k: _total([m[k] for m in multis]) for k in ("loads", "load_s", "evictions")},
        "rounds": [_compact(x) for x in out_rounds],
    }


def _cpu_ratio(sides: dict[str, dict[str, Any]]) -> float | None:
    """The server's CPU seconds a token on the single-adapter load over those on the Zipf
    load (every thread of the server, its reads included): what the Zipf load costs in
    work, apart from the waits and the machine's other load that wall time also holds."""
    per = []
    for side in ("single", "multi"):
        x = sides.get(side, {})
        toks = (x.get("tokens_per_s") or 0) * (x.get("wall_s") or 0)
        per.append(x["server_cpu_s"] / toks if toks and x.get("server_cpu_s") else None)
    return per[0] / per[1] if per[0] and per[1] else None


def _compact(rnd: dict[str, Any]) -> dict[str, Any]:
    """A round for the JSON: the TTFT lists replaced by their p50/p95 and counts."""
    out: dict[str, Any] = {"round": rnd["round"], "ratio": rnd["ratio"],
                           "cpu_ratio": rnd.get("cpu_ratio")}  # fmt: skip
    for side in ("single", "single16", "multi"):
        if side not in rnd:
            continue
        s = dict(rnd[side])
        for key in ("ttft_resident", "ttft_cold"):
            vals = s.pop(key)
            s[f"{key}_p50"], s[f"n_{key[5:]}"] = percentile(vals, 50), len(vals)
        out[side] = s
    return out


def rank_matched(rnds: list[dict[str, Any]], picks: list[list[int]]) -> dict[str, Any]:
    """Each round's Zipf throughput against a single adapter of the Zipf load's own mean
    rank (`ratio_matched`), beside the rank-16 one (`ratio_r16`): the single-adapter time
    a token interpolated in rank between the round's rank-8 and rank-16 loads (a LoRA's
    work is linear in its rank). The pool alternates ranks 8 and 16, and Zipf favours
    `a0000` (rank 8), so a load's mean rank is ~11.5-12; the rank-8 reference alone
    compares it with a cheaper adapter than the ones it serves."""
    out = []
    for rnd, ps in zip(rnds, picks, strict=True):
        s8, s16 = (rnd.get(k, {}).get("tokens_per_s") for k in ("single", "single16"))
        m = rnd["multi"]["tokens_per_s"]
        mean = sum(8 if a % 2 == 0 else 16 for a in ps) / len(ps)
        rnd["mean_rank"] = mean
        if not (s8 and s16 and m):
            continue
        per_token = 1 / s8 + (mean - 8) / 8 * (1 / s16 - 1 / s8)
        rnd["ratio_matched"], rnd["ratio_r16"] = m * per_token, m / s16
        out.append(rnd)
    med = statistics.median
    return {
        "ratio_matched_median": med([x["ratio_matched"] for x in out]) if out else None,
        "ratio_r16_median": med([x["ratio_r16"] for x in out]) if out else None,
        "single16_tokens_per_s": med([x["single16"]["tokens_per_s"] for x in out]) if out else None,
        "mean_rank": med([x["mean_rank"] for x in rnds]) if rnds else None,
    }
