"""`bench.adapter_scale`'s adapter files: a shared pool of N distinct random GGUF LoRA
adapters for the real model (rank 8 and 16 alternating, every projection of every layer),
written once and reused, and `--lora-dir` folders of hard links to its first N.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from bench.workloads import AdapterShapes, adapter_tensors

POOL = Path.home() / ".cache" / "loraserve" / "scale-adapters"


def pool_dir(dtype: str) -> Path:
    """The shared pool of adapter files of one tensor type."""
    return POOL if dtype == "f16" else POOL.with_name(f"{POOL.name}-{dtype}")


def adapter_pool(n: int, dtype: str = "f16") -> list[Path]:
    """`n` adapters `a0000.gguf`... in the shared pool (written once, reused after); the
    f32 pool holds the f16 pool's values widened (the same answers, twice the bytes)."""
    from loraserve.model.gguf_write import write_gguf

    pool = pool_dir(dtype)
    pool.mkdir(parents=True, exist_ok=True)
    shapes = AdapterShapes()
    paths = []
    for i in range(n):
        rank = 8 if i % 2 == 0 else 16
        path = pool / f"a{i:04d}.gguf"
        if not path.is_file():
            meta = {
                "general.architecture": "gemma3",
                "general.type": "adapter",
                "adapter.type": "lora",
                "adapter.lora.alpha": float(rank),
            }
            tensors = adapter_tensors(1000 + i, shapes, rank)
            if dtype == "f32":
                tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
            tmp = path.with_suffix(".part")
            write_gguf(tmp, meta, tensors)
            tmp.rename(path)
        if (i + 1) % 250 == 0:
            print(f"adapters: {i + 1}/{n} written", file=sys.stderr)
        paths.append(path)
    return paths


def lora_dir(n: int, dtype: str = "f16") -> Path:
    """A directory holding exactly the first `n` pool adapters (hard links)."""
    folder = POOL.parent / f"scale-dir-{n}{'' if dtype == 'f16' else '-' + dtype}"
    folder.mkdir(exist_ok=True)
    for path in adapter_pool(n, dtype):
        link = folder / path.name
        if not link.exists():
            os.link(path, link)
    return folder
