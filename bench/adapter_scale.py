"""Thousands of adapters: `python -m bench.adapter_scale [--quick] [--sizes 8,64,512,2000]`.

The real model with N distinct random LoRA adapters (rank 8 and 16 alternating, all seven
projections of every layer) under one `--lora-dir`, served by name on first use with
`--lora-max-loaded 64`. 8 closed-loop clients send greedy streamed completions; each request
names one adapter drawn by Zipf popularity (s = 1.1) over the N. The same load with every
request on one adapter is the reference: each server (one per N) serves a warm-up, then
`--repeats` paired rounds, each the single-adapter load and the Zipf load back to back in
alternating order, and the ratio is the median of the rounds' Zipf / single throughputs
(`bench/adapter_scale_rounds.py` says why: a reference measured once, on a server of its
own, varied 191-300 tok/s between runs). The single adapter `a0000` has rank 8 while the
Zipf loads' mean rank is ~11.5-12 (ranks alternate 8/16 and Zipf favours `a0000`), so each
round also serves the single-adapter load on `a0001` (rank 16; `--no-rank16`: not) and
reports the Zipf load against a single adapter of its own mean rank (`rank_matched`) beside
the issue's rank-8 reference. `CPU a token` is the server's CPU seconds a token, single
over Zipf: the work the Zipf load adds, apart from waits and the machine's other load.
Round 0 is the first use of its adapters (read from
disk), the later rounds the steady state; both are reported. TTFT p50/p95 are split by
whether the adapter was resident (used within the last 64 distinct adapters the client side
sent, an LRU model of the server's tier) or had to be read from disk. Peak RSS (VmHWM,
and RSS sampled every 0.2 s: anonymous and file pages, a timeline) is reported against
the budgets (`adapter_scale_memory.server_memory`): the RSS once warm, the most KV the
flags allow (`--cache-ram`, 256 MiB here by default: every prompt is new, so a larger
cache only fills with KV no request reads, up to 2.3 GiB at -1), the adapter budget and
the reads in flight; and the server's `loraserve:lora_resident_bytes` at the end.
Each row says what share of its adapters' file bytes the page cache held at its start
(`fincore`): the requests name the same adapters from run to run, so a second run reads
them from memory unless `--cold` drops them first (before every Zipf round).

The adapters are float16 GGUF files by default (`--dtype f16`): 3.8 MB at rank 8 and 7.6 MB
at rank 16 (18 layers x 7 projections, 237,312 (in + out) values per rank), ~11 GB for the
2,000. That is what llama.cpp's `convert_lora_to_gguf.py --outtype f16` (or `auto` on a
16-bit checkpoint) writes; its default outtype is f32, and PEFT saves float32 LoRA weights
unless told otherwise (`get_peft_model(autocast_adapter_dtype=True)` widens 16-bit ones), so
`--dtype f32` runs the same values stored as float32 (twice the bytes per cold read, and no
float16 kernel path) in a pool of its own. PEFT's default targets for Gemma 3 are q_proj and
v_proj only (0.74 MB at rank 8 in f16); every projection here is the heavier case.

llama-server takes part in the 8-adapter case only, as its reference: all adapters loaded
at start (`--lora ... --lora-init-without-apply`), each request with the full `lora` list,
its Zipf loads alone (`--peer-repeats`, 1 by default: its load takes ~4x loraserve's). The
servers run one at a time, never together. Writes
`bench/results/adapter_scale_<ts>.json` after every server and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.adapter_scale_memory import drop_cached, kv_max_mib, page_cached, sampler, server_memory
from bench.adapter_scale_pool import adapter_pool, lora_dir
from bench.adapter_scale_report import table
from bench.adapter_scale_rounds import TierModel, metrics, rank_matched, rounds
from bench.client import body
from bench.peer import find_peer
from bench.servers import free_port, launch, loraserve_kind, machine, peer_kind, server_argv
from bench.workloads import sentence, zipf_choices

MODEL = Path.home() / ".cache" / "loraserve" / "gemma3-270m-q4_k_m.gguf"
RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Plan:
    """The workload's sizes; `--quick` is a short check that everything runs."""

    sizes: tuple[int, ...] = (8, 64, 512, 2000)
    clients: int = 8
    requests: int = 96  # per size
    n_predict: int = 32
    prompt_words: int = 40
    max_loaded: int = 64
    parallel: int = 8
    ctx: int = 8192
    seed: int = 0
    dtype: str = "f16"  # the adapter files' tensor type: f16 or f32
    cold: bool = False  # drop the adapters' files from the page cache before each run
    repeats: int = 5  # paired rounds (single-adapter load, Zipf load) per server
    warmup: int = 8  # requests on adapter 0 before the rounds (not counted)
    peer_repeats: int = 1  # llama-server's Zipf rounds (its 8-adapter load is ~4x slower)
    cache_ram: int = 256  # --cache-ram MiB, both servers (-1: no bound)
    threads: int = 2  # -t, both servers
    rank16: bool = True  # a rank-16 single-adapter load in each round too (`rank_matched`)

    @staticmethod
    def quick() -> Plan:
        return Plan(sizes=(8, 64), requests=16, n_predict=4, prompt_words=8, repeats=2,
                    warmup=4)  # fmt: skip


def prompts(plan: Plan, tag: str) -> list[str]:
    """One distinct prompt per request, `tag` first (a round and side of its own: no
    prefix shared with any other request of the run); the same sentences for every tag,
    so both sides of a round prefill the same lengths."""
    rng = random.Random(plan.seed)
    return [f"{tag}{i}: " + sentence(rng, plan.prompt_words) for i in range(plan.requests)]


def _payloads(plan: Plan, tag: str, picks: list[int], lora) -> list[dict[str, Any]]:
    out = []
    for text, a in zip(prompts(plan, tag), picks, strict=True):
        p = body([], plan.n_predict, lora(a))
        p["prompt"] = text
        out.append(p)
    return out


def _workload(plan: Plan, n: int, lora) -> tuple:
    """(warm-up payloads, single(r), multi(r), single16(r)): round r's single-adapter load
    (every request on adapter 0, rank 8), its Zipf load over `n` adapters (seed + r), and
    the single-adapter load on adapter 1 (rank 16)."""
    warm = _payloads(replace(plan, requests=plan.warmup), f"w{n}-", [0] * plan.warmup, lora)

    def single(r: int, a: int = 0, tag: str = "s") -> tuple[list[dict[str, Any]], list[int]]:
        picks = [a] * plan.requests
        return _payloads(plan, f"n{n}r{r}{tag}-", picks, lora), picks

    def single16(r: int) -> tuple[list[dict[str, Any]], list[int]]:
        return single(r, 1, "t")

    def multi(r: int) -> tuple[list[dict[str, Any]], list[int]]:
        picks = zipf_choices(n, plan.requests, plan.seed + r)
        return _payloads(plan, f"n{n}r{r}m-", picks, lora), picks

    return warm, single, multi, single16


def run_loraserve(plan: Plan, model: Path, n: int) -> dict[str, Any]:
    """One loraserve server over `n` adapters by name: warm-up, then paired rounds."""
    folder = lora_dir(n, plan.dtype)
    kind = loraserve_kind(
        ("--lora-dir", str(folder), "--metrics", "--lora-max-loaded", str(plan.max_loaded))
    )
    picks = sorted({a for r in range(plan.repeats)
                    for a in zipf_choices(n, plan.requests, plan.seed + r)})  # fmt: skip
    used = [folder / f"a{a:04d}.gguf" for a in picks]
    file_mib = sum(p.stat().st_size for p in used) / len(used) / 2**20
    largest = max(p.stat().st_size for p in used) / 2**20
    if plan.cold:
        drop_cached(used)
    cached = page_cached(used)

    def before_multi(round_picks: list[int]) -> dict[str, Any]:
        files = [folder / f"a{a:04d}.gguf" for a in sorted(set(round_picks))]
        if plan.cold:  # every read of the round from the disk (resident ones need none)
            drop_cached(files)
        return {"page_cached": page_cached(files)}  # the round's files, as its load starts

    warm, single, multi, single16 = _workload(
        plan, n, lambda a: [{"name": f"a{a:04d}", "scale": 1.0}]
    )
    port = free_port()
    argv = server_argv(kind, model, port, threads=plan.threads, parallel=plan.parallel,
                       ctx=plan.ctx, cache_ram=plan.cache_ram)  # fmt: skip
    kv_mib = kv_max_mib(model, plan.parallel, plan.ctx, plan.cache_ram)
    with launch(kind.name, argv, port, timeout=300) as server:
        rss = sampler(server.proc.pid)
        out = rounds(server, plan.clients, plan.repeats, warm, single, multi,
                     TierModel(plan.max_loaded), before_multi, rss.mark,
                     single16 if plan.rank16 else None)  # fmt: skip
        if plan.rank16:
            out.update(rank_matched(out["rounds"], [multi(r)[1] for r in range(plan.repeats)]))
        out.update({k: v for k, v in metrics(server.url).items()
                    if k in ("resident_bytes", "resident")})  # fmt: skip
        out["budget"] = plan.max_loaded
        out["peak_rss_mib"] = server.peak_rss_mib()
        out["startup_s"] = server.startup_s
        out.update(server_memory(rss.stop(), kv_mib, plan.max_loaded, largest))
    return {"server": "loraserve", "adapters": n, "dtype": plan.dtype, "file_mib": file_mib,
            "page_cached": cached, **out}  # fmt: skip


def run_peer(plan: Plan, model: Path, binary: Path, n: int) -> dict[str, Any]:
    """llama-server with `n` adapters loaded at start, the same Zipf loads by id (every
    request carries the whole list, its adapter at scale 1), `peer_repeats` rounds."""
    warm, _, multi, _ = _workload(
        plan, n, lambda a: [{"id": i, "scale": 1.0 if i == a else 0.0} for i in range(n)]
    )
    kind = peer_kind(binary)
    port = free_port()
    argv = server_argv(kind, model, port, threads=plan.threads, parallel=plan.parallel,
                       ctx=plan.ctx, cache_ram=plan.cache_ram,
                       adapters=adapter_pool(n, plan.dtype))  # fmt: skip
    with launch(kind.name, argv, port, timeout=300) as server:
        rss = sampler(server.proc.pid)
        out = rounds(server, plan.clients, plan.peer_repeats, warm, None, multi, TierModel(n),
                     mark=rss.mark)  # fmt: skip
        out["peak_rss_mib"] = server.peak_rss_mib()
        sampled = rss.stop()
        out.update({k: v for k, v in sampled.items() if k.startswith("peak_")})
        out["startup_s"] = server.startup_s
    return {"server": "llama-server", "adapters": n, "dtype": plan.dtype, **out}


def main(argv: list[str] | None = None) -> None:
    """Run every size, the single-adapter reference and the peer's 8-adapter case."""
    ap = argparse.ArgumentParser(prog="python -m bench.adapter_scale", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a short check that it all runs")
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--sizes", help="comma-separated adapter counts (default 8,64,512,2000)")
    ap.add_argument("--requests", type=int, help="requests per size")
    ap.add_argument("--no-peer", action="store_true", help="skip llama-server")
    ap.add_argument("--dtype", choices=("f16", "f32"), help="adapter tensor type (default f16)")
    ap.add_argument("--cold", action="store_true", help="adapter files out of the page cache")
    ap.add_argument("--repeats", type=int, help="paired rounds per server (default 5)")
    ap.add_argument("--peer-first", action="store_true", help="llama-server before loraserve")
    ap.add_argument("--peer-repeats", type=int, help="llama-server's Zipf rounds (default 1)")
    ap.add_argument("--cache-ram", type=int, help="--cache-ram MiB, both servers (default 256)")
    ap.add_argument("--threads", type=int, help="-t, both servers (default 2)")
    ap.add_argument("--no-rank16", action="store_true", help="no rank-16 single-adapter load")
    args = ap.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    if args.sizes:
        plan = replace(plan, sizes=tuple(int(x) for x in args.sizes.split(",")))
    if args.requests:
        plan = replace(plan, requests=args.requests)
    if args.dtype:
        plan = replace(plan, dtype=args.dtype)
    if args.repeats:
        plan = replace(plan, repeats=args.repeats)
    if args.peer_repeats:
        plan = replace(plan, peer_repeats=args.peer_repeats)
    if args.cache_ram is not None:
        plan = replace(plan, cache_ram=args.cache_ram)
    if args.threads:
        plan = replace(plan, threads=args.threads)
    plan = replace(plan, cold=args.cold, rank16=not args.no_rank16)
    adapter_pool(max(plan.sizes), plan.dtype)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y-%m-%d_%H%M%S")
    tag = ("_quick" if args.quick else "") + ("" if plan.dtype == "f16" else f"_{plan.dtype}")
    tag += "_cold" if plan.cold else ""
    path = RESULTS / f"adapter_scale_{stamp}{tag}.json"
    rows: list[dict[str, Any]] = []

    def write() -> None:  # after every server: a window cut short keeps what it measured
        env = {k: v for k, v in os.environ.items() if k.startswith(("LORASERVE_", "OMP_"))}
        doc = {"plan": asdict(plan), "machine": machine(), "env": env, "rows": rows}
        path.write_text(json.dumps(doc, indent=1))

    binary = None if args.no_peer else find_peer()
    if binary is not None and 8 in plan.sizes and args.peer_first:
        rows.append(run_peer(plan, args.model, binary, 8))
        write()
    for n in plan.sizes:
        rows.append(run_loraserve(plan, args.model, n))
        brief = {k: v for k, v in rows[-1].items() if k not in ("rounds", "rss_timeline")}
        print(json.dumps(brief), file=sys.stderr)
        write()
    if binary is not None and 8 in plan.sizes and not args.peer_first:
        rows.append(run_peer(plan, args.model, binary, 8))
        write()
    print(table(rows))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
