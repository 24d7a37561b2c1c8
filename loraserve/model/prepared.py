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
# smaller models requantize in well under a second: no cache file for them (and none
# for the tiny models tests write by the hundred)
MIN_MODEL_BYTES = 32 << 20


def prepared_cache_file(model_path: Path) -> Path | None:
    """Cache file name derived from the model file's identity (path, size, mtime); None
    for models too small to need one."""
    st = model_path.stat()
    if st.st_size < MIN_MODEL_BYTES:
        return None
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


def save_prepared(path: Path, decoder: Decoder, source: str) -> None:
    """Store every int8 projection of ``decoder`` (atomically; failures only log), and
    drop older caches of the same ``source`` model file."""
    flat: dict[str, torch.Tensor] = {}
    for mod in decoder.modules():
        w8, s8 = getattr(mod, "w8", None), getattr(mod, "s8", None)
        if w8 is not None and s8 is not None:
            flat[mod.name + ".q8"] = w8.contiguous()
            flat[mod.name + ".s8"] = s8.contiguous()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        save_file(flat, str(tmp), metadata={"source": source, "format": FORMAT})
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write prepared-weights cache %s: %s", path, e)
        return
    _drop_stale(path, source)


def _drop_stale(current: Path, source: str) -> None:
    """Delete older cache files of the same model file (an earlier format or mtime)."""
    from safetensors import safe_open

    for other in current.parent.glob("*.safetensors"):
        if other == current:
            continue
        try:
            with safe_open(str(other), "pt") as f:
                stale = (f.metadata() or {}).get("source") == source
            if stale:
                other.unlink()
                log.info("removed stale prepared-weights cache %s", other)
        except Exception:  # unreadable or foreign files are left alone
            continue
