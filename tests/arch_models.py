"""Tiny random models of every architecture, as llama.cpp's `test-llama-archs` shapes them
(n_embd 256, 2 heads, n_ff 384, 2 layers, the 128-token `test` vocabulary, per-architecture
exceptions in its source), written by loraserve's own GGUF writer from a recorded spec and a
seed, so tests rebuild the very files llama-server answered on (scripts/record_arch_cases.py).

A spec is what `test-llama-archs -o DIR` wrote for the architecture: its metadata, typed, and
its tensor table (name, shape, type), kept to the tensors the model uses. The values are ours:
each tensor's own normal draws from ``(seed, crc32(name))``.
"""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from loraserve.model.gguf import GGUFFile
from loraserve.model.gguf_write import write_gguf

_NUMPY = {"UINT8": np.uint8, "INT8": np.int8, "UINT16": np.uint16, "INT16": np.int16,
          "UINT32": np.uint32, "INT32": np.int32, "FLOAT32": np.float32, "BOOL": np.bool_,
          "UINT64": np.uint64, "INT64": np.int64, "FLOAT64": np.float64}  # fmt: skip


def typed_metadata(entries: list[list[Any]]) -> dict[str, Any]:
    """Recorded ``[key, type, value]`` entries (type ``UINT32``, ``STRING``,
    ``ARRAY:FLOAT32``...) -> values our writer stores with exactly those GGUF types."""
    out: dict[str, Any] = {}
    for key, vtype, value in entries:
        if vtype == "STRING" or vtype == "ARRAY:STRING":
            out[key] = value
        elif vtype.startswith("ARRAY:"):
            out[key] = np.array(value, dtype=_NUMPY[vtype[6:]])
        elif vtype == "BOOL":
            out[key] = bool(value)
        else:
            out[key] = _NUMPY[vtype](value)
    return out


def tensor_values(spec: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every tensor of the spec [torch-order shape] float32, drawn from N(0, stdev) with the
    generator seeded by (seed, crc32(name)); with the generator's ``negative_a``, Mamba's
    ``ssm_a`` as -|x| (test-llama-archs' rule: Mamba-1's per-channel A must decay)."""
    seed, stdev = int(spec["generator"]["seed"]), float(spec["generator"]["stdev"])
    negative_a = bool(spec["generator"].get("negative_a", False))
    out = {}
    for name, shape, _ in spec["tensors"]:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        v = rng.normal(0.0, stdev, size=tuple(shape)).astype(np.float32)
        if negative_a and name.endswith(".ssm_a"):  # as test-llama-archs: a decaying state
            v = -np.abs(v)
        out[name] = v
    return out


def write_model(spec: dict[str, Any], path: Path, types: dict[str, int] | None = None) -> Path:
    """The spec's model at ``path``: F32 (the template's float types), or each tensor in
    ``types`` (name -> ggml type) quantized by `loraserve.model.quantize`."""
    meta = typed_metadata(spec["metadata"])
    tensor_types = {name: t for name, _, t in spec["tensors"]}
    if types is not None:
        tensor_types.update(types)
    return write_gguf(path, meta, tensor_values(spec), tensor_types)


def tensor_digest(path: Path) -> tuple[str, dict[str, int]]:
    """sha256 over every tensor's name, ggml type and bytes, by name (llama-quantize writes
    them in its own order), and the types."""
    h = hashlib.sha256()
    types = {}
    with GGUFFile(path) as gg:
        for name, info in sorted(gg.tensors.items()):
            h.update(name.encode() + b"\0" + str(info.ggml_type).encode() + b"\0")
            h.update(gg.raw(name).tobytes())
            types[name] = info.ggml_type
    return h.hexdigest(), types


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
