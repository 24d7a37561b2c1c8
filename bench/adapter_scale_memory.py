"""Adapter memory at scale: `python -m bench.adapter_scale_memory [--adapters 2000]`.

The real model in this process and `--adapters` of `bench.adapter_scale`'s pool (float16
GGUF files, rank 8 and 16) read one after the other through the registry under
`--lora-max-loaded`'s bound (the least recently used idle one evicted past it, as the
tiers do), then: the resident adapters' weight bytes as the registry counts them (each
tensor held, shared weights once: `test_tier_memory`'s accounting) against their files'
sizes, and the process's RSS and peak RSS (VmRSS, VmHWM) before the first adapter and at
the end. Not a speed figure: it may run on a loaded machine. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

from bench.adapter_scale import MODEL, adapter_pool


def _status(key: str) -> float:
    """A /proc/self/status field in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(n: int, max_loaded: int, model_path: Path, dtype: str) -> dict[str, float]:
    """Read `n` pool adapters under the bound; the byte counts and RSS at the end."""
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
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.adapters, args.max_loaded, args.model, args.dtype)))


if __name__ == "__main__":
    main()
