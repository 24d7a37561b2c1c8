"""GGUF header primitives: value types, format limits and the bounds-checked sequential parser.

Every read checks the file's bounds, so a truncated or crafted header raises `GGUFError` naming
what it was reading, before any tensor data is touched.
"""

from __future__ import annotations

import math
import mmap
import struct
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # ggml's limit: a tensor name is at most 63 bytes (gguf.cpp refuses more)
MAX_KEY_BYTES = 1 << 16  # a metadata key name
MAX_ARRAY_DEPTH = 2  # an array of arrays at most (llama.cpp reads no nested array at all)
# Arrays inside arrays cost a Python object each (~100 bytes) for 12 bytes of file: their
# total per file is bounded, so a crafted file cannot amplify its size in memory.
MAX_NESTED_ARRAYS = 1 << 16
MAX_ELEMENTS = 1 << 48  # elements of one tensor (ggml: the product must fit an int64)

# GGUF value type id -> (name, struct code / numpy dtype); 8 = string, 9 = array
VALUE_TYPES: dict[int, tuple[str, str]] = {
    0: ("UINT8", "B"), 1: ("INT8", "b"), 2: ("UINT16", "H"), 3: ("INT16", "h"),
    4: ("UINT32", "I"), 5: ("INT32", "i"), 6: ("FLOAT32", "f"), 7: ("BOOL", "?"),
    10: ("UINT64", "Q"), 11: ("INT64", "q"), 12: ("FLOAT64", "d"),
}  # fmt: skip
_STRUCTS = {t: struct.Struct("<" + code) for t, (_, code) in VALUE_TYPES.items()}
_U32, _U64 = _STRUCTS[4], _STRUCTS[10]


class GGUFError(ValueError):
    """The file is not a GGUF file loraserve can read; the message says what is wrong."""


class _Parser:
    """Sequential reads over the mapped file; every read checks the bounds."""

    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf, self.size, self.pos = buf, size, 0
        self.where = "header"
        self.nested = 0  # arrays read inside arrays so far (bounded by MAX_NESTED_ARRAYS)

    def _truncated(self, need: int) -> GGUFError:
        return GGUFError(
            f"truncated file: {self.where} needs {need} bytes at offset {self.pos}, "
            f"but the file has {self.size} bytes"
        )

    def scalar(self, vtype: int) -> Any:
        s = _STRUCTS[vtype]
        if self.pos + s.size > self.size:
            raise self._truncated(s.size)
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def string(self) -> str:
        n = self.scalar(10)
        if self.pos + n > self.size:
            raise self._truncated(n)
        s = self.buf[self.pos : self.pos + n].decode("utf-8", "surrogateescape")
        self.pos += n
        return s

    def value(self, vtype: int) -> Any:
        if vtype in _STRUCTS:
            return self.scalar(vtype)
        if vtype == 8:
            return self.string()
        if vtype == 9:
            return self.array(1)
        raise GGUFError(f"unknown metadata value type {vtype} in {self.where}")

    def array(self, depth: int) -> np.ndarray | list[Any]:
        vtype, count = self.scalar(4), self.scalar(10)
        if count > self.size - self.pos:  # every element takes at least one byte
            raise self._truncated(count)
        if vtype in _STRUCTS:
            nbytes = count * _STRUCTS[vtype].size
            if self.pos + nbytes > self.size:
                raise self._truncated(nbytes)
            dtype = np.dtype(np.bool_ if vtype == 7 else "<" + VALUE_TYPES[vtype][1])
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += nbytes
            return arr
        if vtype == 8:
            return self.strings(count)
        if vtype == 9:
            if depth >= MAX_ARRAY_DEPTH:
                raise GGUFError(f"arrays nested deeper than {MAX_ARRAY_DEPTH} in {self.where}")
            self.nested += count
            if self.nested > MAX_NESTED_ARRAYS:
                raise GGUFError(
                    f"more than {MAX_NESTED_ARRAYS} arrays inside arrays in the metadata "
                    f"({self.where})"
                )
            return [self.array(depth + 1) for _ in range(count)]
        raise GGUFError(f"unknown array element type {vtype} in {self.where}")

    def strings(self, count: int) -> list[str]:
        buf, pos, size = self.buf, self.pos, self.size
        if pos + 8 * count > size:
            raise self._truncated(8 * count)
        out: list[str] = [""] * count
        unpack = _U64.unpack_from
        try:
            for i in range(count):
                (n,) = unpack(buf, pos)
                end = pos + 8 + n
                if end > size:
                    raise self._truncated(n)
                out[i] = buf[pos + 8 : end].decode("utf-8", "surrogateescape")
                pos = end
        except struct.error:
            self.pos = pos
            raise self._truncated(8) from None
        self.pos = pos
        return out


_DIMS = {n: struct.Struct(f"<{n}Q") for n in range(1, GGML_MAX_DIMS + 1)}
_TYPE_OFFSET = struct.Struct("<IQ")

TableRecord = tuple[str, tuple[int, ...], int, int]  # name, torch-order shape, type, offset


def plain_tensor_table(
    buf: mmap.mmap, pos: int, size: int, n: int
) -> tuple[list[TableRecord], int] | None:
    """A fast path for small files read often (adapters): the ``n`` tensor records from
    ``pos`` as `GGUFFile` reads them (name, shape in torch order, ggml type, offset relative
    to the data section) and where they end, in one loop of unpacks; None as soon as a record
    breaks any of the checked reader's rules (name of 1 to 63 bytes, 1 to 4 dims, each
    positive, at most 2^48 elements, inside the file), so the caller reads it the checked
    way, which names the problem. Records it returns are those the checked reader returns."""
    u64, u32, typed = _U64.unpack_from, _U32.unpack_from, _TYPE_OFFSET.unpack_from
    out: list[TableRecord] = []
    try:
        for _ in range(n):
            (length,) = u64(buf, pos)
            end = pos + 8 + length
            if not 0 < length < GGML_MAX_NAME or end + 4 > size:
                return None  # the name's byte length is what ggml bounds (undecoded here)
            name = buf[pos + 8 : end].decode("utf-8", "surrogateescape")
            (n_dims,) = u32(buf, end)
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                return None
            ne = _DIMS[n_dims].unpack_from(buf, end + 4)
            pos = end + 4 + 8 * n_dims
            ggml_type, rel = typed(buf, pos)
            pos += 12
            if min(ne) < 1 or math.prod(ne) > MAX_ELEMENTS:
                return None
            out.append((name, ne[::-1], ggml_type, rel))
    except struct.error:  # past the end of the file
        return None
    return out, pos
