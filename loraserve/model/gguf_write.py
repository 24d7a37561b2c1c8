"""A small GGUF v3 writer, used for LoRA adapter files that llama.cpp loads.

Metadata value types follow the Python values: `bool` -> BOOL, `int` -> INT32 (INT64 when it
does not fit; UINT32 for the keys in `UINT32_KEYS`), `float` -> FLOAT32, `str` -> STRING, and
lists/tuples of one kind -> ARRAY of it (a mix of ints and floats -> FLOAT32). A numpy scalar
or 1-D array keeps its exact dtype (`np.uint32(5)`, `np.array([...], np.int64)`), which is how
a caller asks for any other type.
"""

from __future__ import annotations

import os
import secrets
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .dequant import GGML_TYPE, type_name
from .gguf import DEFAULT_ALIGNMENT, GGUF_MAGIC
from .quantize import QUANTIZERS, quantize

# GGUF value type ids
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = range(10)
UINT64, INT64, FLOAT64 = 10, 11, 12

UINT32_KEYS = frozenset({"general.alignment", "general.quantization_version", "general.file_type"})

_NUMPY_TYPES: dict[np.dtype[Any], int] = {
    np.dtype(t): v
    for t, v in [
        (np.uint8, UINT8), (np.int8, INT8), (np.uint16, UINT16), (np.int16, INT16),
        (np.uint32, UINT32), (np.int32, INT32), (np.float32, FLOAT32), (np.bool_, BOOL),
        (np.uint64, UINT64), (np.int64, INT64), (np.float64, FLOAT64),
    ]
}  # fmt: skip
_STRUCT_CODES = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i",
                 FLOAT32: "f", BOOL: "?", UINT64: "Q", INT64: "q", FLOAT64: "d"}  # fmt: skip
_TORCH_TYPES = {torch.float32: GGML_TYPE["F32"], torch.float16: GGML_TYPE["F16"],
                torch.bfloat16: GGML_TYPE["BF16"]}  # fmt: skip
# float types, and the quantized ones `quantize` writes as ggml's reference quantizers do
WRITABLE_TYPES = frozenset(
    [GGML_TYPE[n] for n in ("F32", "F16", "BF16", "Q8_0")] + list(QUANTIZERS)
)


def _int_type(values: Sequence[int], key: str) -> int:
    lo, hi = min(values), max(values)
    if key in UINT32_KEYS and 0 <= lo and hi < 1 << 32:
        return UINT32
    if -(1 << 31) <= lo and hi < 1 << 31:
        return INT32
    if -(1 << 63) <= lo and hi < 1 << 63:
        return INT64
    if 0 <= lo and hi < 1 << 64:
        return UINT64
    raise ValueError(f"metadata {key!r}: integer out of 64-bit range")


def _list_type(key: str, items: Sequence[Any]) -> int:
    """The GGUF element type for a python list of one kind."""
    if not items:
        raise ValueError(f"metadata {key!r}: empty list (pass a typed numpy array instead)")
    if all(isinstance(v, str) for v in items):
        return STRING
    if all(isinstance(v, bool | np.bool_) for v in items):
        return BOOL
    if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return _int_type(items, key)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
        return FLOAT32
    if all(isinstance(v, list | tuple | np.ndarray) for v in items):
        return ARRAY
    raise ValueError(f"metadata {key!r}: list items must all be of one kind")


def _value_type(key: str, v: Any) -> int:
    if isinstance(v, np.generic) and v.dtype in _NUMPY_TYPES:
        return _NUMPY_TYPES[v.dtype]
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        return _int_type([v], key)
    if isinstance(v, float):
        return FLOAT32
    if isinstance(v, str):
        return STRING
    if isinstance(v, list | tuple | np.ndarray):
        return ARRAY
    raise ValueError(f"metadata {key!r}: cannot store a {type(v).__name__} in GGUF")


def _pack_string(s: str) -> bytes:
    b = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _pack_array(key: str, v: Sequence[Any] | np.ndarray) -> bytes:
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype not in _NUMPY_TYPES:
            raise ValueError(
                f"metadata {key!r}: arrays must be 1-D numeric, got {v.dtype}{v.shape}"
            )
        etype = _NUMPY_TYPES[v.dtype]
        return struct.pack("<IQ", etype, len(v)) + v.astype(v.dtype.newbyteorder("<")).tobytes()
    etype = _list_type(key, v)
    head = struct.pack("<IQ", etype, len(v))
    if etype == STRING:
        return head + b"".join(_pack_string(s) for s in v)
    if etype == ARRAY:
        return head + b"".join(_pack_array(key, a) for a in v)
    return head + struct.pack(f"<{len(v)}{_STRUCT_CODES[etype]}", *v)


def _pack_value(key: str, v: Any) -> bytes:
    vtype = _value_type(key, v)
    if vtype == STRING:
        body = _pack_string(v)
    elif vtype == ARRAY:
        body = _pack_array(key, v)
    else:
        body = struct.pack("<" + _STRUCT_CODES[vtype], v.item() if hasattr(v, "item") else v)
    return struct.pack("<I", vtype) + body


def _round_away(x: np.ndarray) -> np.ndarray:
    """Round half away from zero, as C roundf and gguf-py's np_roundf."""
    a = np.abs(x)
    floored = np.floor(a)
    return np.sign(x) * (floored + np.floor(2 * (a - floored)))


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 (..., k*32) -> Q8_0 blocks as uint8 (n_blocks, 34), as ggml's reference does."""
    blocks = x.astype(np.float32, copy=False).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)  # (n, 1)
    with np.errstate(divide="ignore", over="ignore"):  # d beyond the f16 range becomes inf
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
        qs = _round_away(blocks * inv).astype(np.int8)
        return np.concatenate([d.astype(np.float16).view(np.uint8), qs.view(np.uint8)], axis=1)


def float_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16): round to nearest even, NaNs kept quiet."""
    n = x.astype(np.float32, copy=False).view(np.uint32)
    n = np.where(
        (n & 0x7FFFFFFF) > 0x7F800000, (n & np.uint32(0xFFFF0000)) | np.uint32(64 << 16), n
    )
    return ((n.astype(np.uint64) + (0x7FFF + ((n >> 16) & 1))) >> 16).astype(np.uint16)


def _encode_tensor(
    name: str, t: np.ndarray | torch.Tensor, ggml_type: int | None
) -> tuple[tuple[int, ...], int, bytes]:
    """-> (shape in torch order, ggml type, little-endian bytes)."""
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        if ggml_type is None:
            ggml_type = _TORCH_TYPES.get(t.dtype)
        if t.dtype == torch.bfloat16:
            bits = t.contiguous().view(torch.int16).numpy().view(np.uint16)
            if ggml_type == GGML_TYPE["BF16"]:
                return tuple(t.shape) or (1,), ggml_type, bits.tobytes()
            t = t.to(torch.float32)
        a = t.numpy()
    else:
        a = np.asarray(t)
        if ggml_type is None:
            ggml_type = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}.get(a.dtype)
    shape = tuple(a.shape) or (1,)
    if ggml_type is None:
        raise ValueError(f"tensor {name!r}: no default GGUF type for {a.dtype}; set tensor_types")
    if ggml_type not in WRITABLE_TYPES:
        raise ValueError(f"tensor {name!r}: cannot write type {type_name(ggml_type)}")
    if not np.issubdtype(a.dtype, np.floating):
        raise ValueError(f"tensor {name!r}: expected floating-point data, got {a.dtype}")
    if ggml_type == GGML_TYPE["F32"]:
        data = a.astype("<f4", copy=False)
    elif ggml_type == GGML_TYPE["F16"]:
        data = a.astype("<f2", copy=False)
    elif ggml_type == GGML_TYPE["BF16"]:
        data = float_to_bf16_bits(a)
    elif ggml_type == GGML_TYPE["Q8_0"]:
        if shape[-1] % 32:
            raise ValueError(f"tensor {name!r}: Q8_0 needs rows of a multiple of 32, got {shape}")
        data = quantize_q8_0(a)
    else:
        try:
            data = quantize(a, ggml_type)
        except ValueError as e:
            raise ValueError(f"tensor {name!r}: {e}") from None
    return shape, ggml_type, np.ascontiguousarray(data).tobytes()


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def write_gguf(
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray | torch.Tensor],
    tensor_types: Mapping[str, int] | None = None,
) -> Path:
    """Write a GGUF v3 file atomically (a temporary file in the same folder, then a rename).

    `tensors` map names to arrays in torch order; float32/float16/bfloat16 data is written as
    F32/F16/BF16 unless `tensor_types` names another ggml type id (F32, F16, BF16, or a
    quantized type of `loraserve.model.quantize`: Q8_0, Q5_0, Q4_0, Q4_K, Q6_K).
    Tensors are stored in the given order, each aligned to `general.alignment` (default 32).
    Returns the path written.
    """
    path = Path(path)
    tensor_types = tensor_types or {}
    if unknown := set(tensor_types) - set(tensors):
        raise ValueError(f"tensor_types names tensors that are not given: {sorted(unknown)}")
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int | np.integer) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment must be a power of two, got {alignment!r}")
    alignment = int(alignment)

    head = bytearray(GGUF_MAGIC + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
    for key, value in metadata.items():
        head += _pack_string(key) + _pack_value(key, value)
    blobs: list[bytes] = []
    offset = 0
    for name, t in tensors.items():
        shape, ggml_type, data = _encode_tensor(name, t, tensor_types.get(name))
        head += _pack_string(name) + struct.pack(f"<I{len(shape)}Q", len(shape), *shape[::-1])
        head += struct.pack("<IQ", ggml_type, offset)
        blobs.append(data)
        offset += len(data) + _pad(len(data), alignment)
    head += bytes(_pad(len(head), alignment))

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(head)
            for data in blobs:
                f.write(data)
                f.write(bytes(_pad(len(data), alignment)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
