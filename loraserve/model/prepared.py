"""A disk cache of weights prepared for the fast path (int8 per-row requantization).

Requantizing Gemma 3 270M's projections and its 262,144 x 640 tied output to int8 takes
seconds; the result depends only on the GGUF file, so it is stored once next to the
default model (safetensors, memory-mapped on later starts) and start-up stays within a
few seconds.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from loraserve.model.decoder import Decoder
from loraserve.model.default import cache_dir

log = logging.getLogger("loraserve.model")
FORMAT = "int8rows-v2"  # v2: q|k|v and gate|up stored fused


def prepared_cache_file(model_path: Path) -> Path:
    """Cache file name derived from the model file's identity (path, size, mtime)."""
    st = model_path.stat()
    tag = f"{model_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{FORMAT}"
    import hashlib

    digest = hashlib.sha256(tag.encode()).hexdigest()[:16]
    return cache_dir() / "prepared" / f"{model_path.stem}-{digest}.safetensors"


def load_prepared(path: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{tensor name: (int8 weight, bf16 scales)}, or {} when absent or unreadable."""
    if not path.is_file():
        return {}
    try:
        flat = load_file(str(path))
    except Exception as e:  # a broken cache is rebuilt, never fatal
        log.warning("ignoring unreadable prepared-weights cache %s: %s", path, e)
        return {}
    # clone: tensors sliced from the file buffer may be misaligned, and torch's int8
    # matmul kernel crashes (SIGSEGV) on misaligned weights
    return {
        k.removesuffix(".q8"): (v.clone(), flat[k.removesuffix(".q8") + ".s8"].clone())
        for k, v in flat.items()
        if k.endswith(".q8")
    }


def save_prepared(path: Path, decoder: Decoder) -> None:
    """Store every int8 projection of ``decoder`` (atomically; failures only log)."""
    flat: dict[str, torch.Tensor] = {}
    for mod in decoder.modules():
        w8, s8 = getattr(mod, "w8", None), getattr(mod, "s8", None)
        if w8 is not None and s8 is not None:
            flat[mod.name + ".q8"] = w8.contiguous()
            flat[mod.name + ".s8"] = s8.contiguous()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        save_file(flat, str(tmp))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write prepared-weights cache %s: %s", path, e)
