"""The thread-CPU of first reads of `bench.adapter_scale`'s adapters, by phase
(`python -m bench.adapter_scale_profile --loads N`, which says what is measured)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.adapter_scale_pool import adapter_pool

# (module, function) -> phase: each wrapped where `lora.adapter` calls it
_PHASES = {
    ("loraserve.lora.adapter", "open_gguf"): "parse",
    ("loraserve.lora.adapter", "read_gguf"): "views+checks",
    ("loraserve.lora.adapter", "hold"): "copy+checks",
    ("loraserve.lora.adapter", "_content_id"): "hash",
}


def _timed(phase: str, fn: Callable[..., Any], into: dict[str, list[float]]) -> Callable[..., Any]:
    def run(*args: Any, **kw: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args, **kw)
        finally:
            into.setdefault(phase, []).append(time.thread_time() - t0)

    return run


def profile_loads(model_path: Path, n: int, reps: int, threads: int) -> None:
    """Read the first ``n`` pool adapters ``reps`` times as first reads; print medians."""
    import importlib

    import loraserve.model.gguf as gguf
    from loraserve.lora.adapter import load_adapter
    from loraserve.lora.registry import base_shapes
    from loraserve.model.loader import load_model

    torch.set_num_threads(threads)
    model = load_model(model_path)
    shapes = base_shapes(model.decoder)
    files = adapter_pool(n)
    for f in files:
        f.read_bytes()
    phases: dict[str, list[float]] = {}
    for (mod, name), phase in _PHASES.items():
        m = importlib.import_module(mod)
        if hasattr(m, name):
            setattr(m, name, _timed(phase, getattr(m, name), phases))
    total: list[float] = []
    load_adapter(files[0], model.config, shapes)  # warm: imports, kernels
    phases.clear()
    for _ in range(reps):
        for f in files:
            gguf._LAST_HEADER.clear()  # a first read: no header handed over
            t0 = time.thread_time()
            load_adapter(f, model.config, shapes)
            total.append(time.thread_time() - t0)
    ranks = [8 if int(f.stem[1:]) % 2 == 0 else 16 for f in files] * reps
    print(f"thread-CPU ms a first read, {threads} thread(s), {n} files x {reps}:")
    for rank in (8, 16):
        rows = [i for i, r in enumerate(ranks) if r == rank]
        cells = [f"total {statistics.median(total[i] for i in rows) * 1e3:.2f}"]
        for phase, ts in phases.items():
            cells.append(f"{phase} {statistics.median(ts[i] for i in rows) * 1e3:.2f}")
        print(f"  rank {rank:2d}: " + "  ".join(cells))
