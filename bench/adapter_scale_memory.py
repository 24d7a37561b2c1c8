"""Adapter memory at scale: `python -m bench.adapter_scale_memory [--adapters 2000]`.

The real model in this process and `--adapters` of `bench.adapter_scale`'s pool (float16
GGUF files, rank 8 and 16) read one after the other through the registry under
`--lora-max-loaded`'s bound (the least recently used idle one evicted past it, as the
tiers do), then: the resident adapters' weight bytes as the registry counts them (each
tensor held, shared weights once: `test_tier_memory`'s accounting) against their files'
sizes, and the process's RSS and peak RSS (VmRSS, VmHWM) before the first adapter and at
the end. Not a speed figure: it may run on a loaded machine. Prints one JSON object.

`server_memory` is `bench.adapter_scale`'s account of a server's peak RSS against its
budgets: the RSS once warm, plus the most KV its flags let the pool hold (`-c`, `-np`,
`--cache-ram`: the prefix cache's blocks are KV too), plus the adapter budget
(`--lora-max-loaded` adapters of the largest file used), plus the reads that may be in
flight or held beside it (the readers, unclaimed prefetched reads, and the evicted
adapters whose fused-layer arrays are dropped 8 late). The 06:20 run's 4.8-5.4 GB peaks with
45-380 MiB of adapters were the prefix cache at `--cache-ram -1` (up to 8 slots' worth of
KV, 2.3 GiB of Gemma 270M's float32 KV) and its doubling growth holding the old and new
pools at once; an empty slice of B held as the tail also kept each float16 adapter's
whole B copy alive (1.5x its counted bytes).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.rss_sample import RssSampler

FUSED_LATE = 8  # evicted adapters whose fused-layer arrays may outlive them (`lora.delta`)


def _status(key: str) -> float:
    """A /proc/self/status field in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def kv_max_mib(model: Path, parallel: int, ctx: int, cache_ram: int) -> float:
    """The most KV (slots and prefix cache) a server with these flags may hold, MiB: the
    pool `engine.memory.build_cache` sizes, at its own block size."""
    from loraserve.engine.engine_config import EngineConfig, slot_context
    from loraserve.engine.memory import build_cache
    from loraserve.model.config import ModelConfig
    from loraserve.model.gguf import GGUFFile

    with GGUFFile(model) as gg:
        cfg = ModelConfig.from_gguf(gg.metadata, set(gg.tensors))
    ec = EngineConfig(n_slots=parallel, n_ctx=ctx, cache_ram_mib=cache_ram)
    pool, _, _ = build_cache(cfg, ec, slot_context(ec))
    block = 2 * cfg.n_layers * ec.block_size * cfg.n_kv_heads * cfg.head_dim
    return pool.max_blocks * block * ec.kv_dtype.itemsize / 2**20


def server_memory(
    sampled: dict[str, Any], kv_mib: float, max_loaded: int, file_mib: float
) -> dict[str, Any]:
    """A server's memory against its budgets (MiB): ``sampled`` is `RssSampler.stop`'s,
    ``file_mib`` the largest adapter file used (an adapter holds its file's tensor bytes:
    float16 as its halves, float32 as it is)."""
    from loraserve.engine.adapter_loads import MAX_READS
    from loraserve.lora.prefetch import MAX_UNCLAIMED

    warm = next((v for _, label, v in sampled["marks"] if label == "warm"), None)
    budget = max_loaded * file_mib
    in_flight = (MAX_READS + MAX_UNCLAIMED + FUSED_LATE) * file_mib
    bound = None if warm is None else warm + kv_mib + budget + in_flight
    peak = sampled.get("peak_VmHWM_mib")
    return {
        "rss_warm_mib": warm,
        "kv_max_mib": kv_mib,
        "adapter_budget_mib": budget,
        "adapter_in_flight_mib": in_flight,
        "rss_bound_mib": bound,
        "within_bound": None if bound is None or peak is None else peak <= bound,
        **{k: v for k, v in sampled.items() if k.startswith("peak_")},
        "rss_marks": sampled["marks"],
        "rss_timeline": sampled["timeline"],
    }


def sampler(pid: int) -> RssSampler:
    """The sampler `bench.adapter_scale` runs beside a server (every 0.2 s)."""
    return RssSampler(pid, 0.2)


def measure(n: int, max_loaded: int, model_path: Path, dtype: str) -> dict[str, float]:
    """Read `n` pool adapters under the bound; the byte counts and RSS at the end."""
    from bench.adapter_scale_pool import adapter_pool
    from loraserve.lora.registry import AdapterRegistry
    from loraserve.lora.tiers import TierLimits, victims
    from loraserve.model.loader import load_model

    paths = adapter_pool(n, dtype)
    model = load_model(model_path)
    reg = AdapterRegistry(model, limits=TierLimits(max_loaded=max_loaded))
    gc.collect()
    rss0 = _status("VmRSS")
    t0 = time.perf_counter()
    for path in paths:
        for a in victims(reg.list(), set(), reg.limits, incoming=1):
            reg.evict(a.id)
        a = reg.load(path)
        reg.touch([a.id])
    load_s = time.perf_counter() - t0
    gc.collect()
    resident = reg.resident
    file_bytes = sum(a.path.stat().st_size for a in resident)
    return {
        "adapters": n,
        "dtype": dtype,
        "max_loaded": max_loaded,
        "resident": len(resident),
        "resident_mib": reg.resident_bytes / 2**20,
        "resident_file_mib": file_bytes / 2**20,
        "bytes_per_file_byte": reg.resident_bytes / file_bytes if file_bytes else float("nan"),
        "rss_model_mib": rss0,
        "rss_end_mib": _status("VmRSS"),
        "rss_adapters_mib": _status("VmRSS") - rss0,
        "peak_rss_mib": _status("VmHWM"),
        "load_s_per_adapter": load_s / n,
    }


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, measure, print the JSON."""
    ap = argparse.ArgumentParser(prog="python -m bench.adapter_scale_memory", description=__doc__)
    ap.add_argument("--adapters", type=int, default=2000)
    ap.add_argument("--max-loaded", type=int, default=64)
    ap.add_argument("--model", type=Path, default=None, help="default: bench.adapter_scale's")
    ap.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    args = ap.parse_args(argv)
    from bench.adapter_scale import MODEL

    model = args.model or MODEL
    print(json.dumps(measure(args.adapters, args.max_loaded, model, args.dtype)))


if __name__ == "__main__":
    main()


def page_cached(paths: list[Path]) -> float | None:
    """The share of these files' bytes in the page cache now (util-linux `fincore`), or
    None without it: a cold read from disk costs more than one from memory."""
    try:
        argv = ["fincore", "-b", "-n", "-o", "RES,SIZE", *map(str, paths)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [tuple(map(int, line.split())) for line in out.splitlines() if line.strip()]
    size = sum(sz for _, sz in rows)
    return sum(res for res, _ in rows) / size if size else None


def drop_cached(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (`--cold`: every first read from disk)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
