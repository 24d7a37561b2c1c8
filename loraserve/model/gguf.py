"""A fast GGUF reader: header, metadata and tensor table parsed with `struct`, data memory-mapped.

GGUF (v2, v3; little-endian) is: magic `GGUF`, version u32, tensor count u64, metadata count u64,
the metadata key/value pairs, one info record per tensor (name, dims in ggml order, type, offset
relative to the data section), padding to `general.alignment`, then the tensor data.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .dequant import GGML_QUANT_SIZES, dequantize, type_name

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

# The last parsed header, handed once to the next open of the same file (same device, inode,
# size and modification time, and the same header bytes): start-up checks the header, then
# loads the model, and Gemma's 262,144-token vocabulary takes ~0.4 s to parse. Metadata and
# tensor table are read-only.
_LAST_HEADER: dict[tuple[int, int, int, int], tuple[Any, ...]] = {}


class GGUFError(ValueError):
    """The file is not a GGUF file loraserve can read; the message says what is wrong."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor's entry in the tensor table."""

    name: str
    shape: tuple[int, ...]  # torch order: reversed ggml ne
    ggml_type: int
    offset: int  # absolute file offset of the data
    nbytes: int


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


class GGUFFile:
    """A memory-mapped GGUF file: its metadata, tensor table and tensor data.

    Usable as a context manager. Arrays returned by `raw` share the mapping; tensors returned
    by `tensor` own their memory.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensorInfo] = {}
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            if size == 0:
                raise GGUFError(f"{self.path}: empty file, not GGUF")
            self._mm: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        key = (st.st_dev, st.st_ino, size, st.st_mtime_ns)
        handed = _LAST_HEADER.pop(key, None)
        if handed is not None and self._mm[: len(handed[0])] == handed[0]:
            _, self.version, self.metadata, self.tensors, self.alignment = handed[:5]
            self.data_offset = handed[5]
        else:
            try:
                self._parse(size)
            except GGUFError as e:
                self.close()
                raise GGUFError(f"{self.path}: {e}") from None
            _LAST_HEADER.clear()
            header = self._mm[: self.data_offset]  # compared on hand-over: same bytes, same parse
            _LAST_HEADER[key] = (header, self.version, self.metadata, self.tensors,
                                 self.alignment, self.data_offset)  # fmt: skip
        self._data = np.frombuffer(self._mm, dtype=np.uint8)  # whole file

    def _parse(self, size: int) -> None:
        p = _Parser(self._mm, size)
        magic = bytes(self._mm[:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"bad magic {magic!r}, expected {GGUF_MAGIC!r}: not a GGUF file")
        p.pos = 4
        self.version: int = p.scalar(4)
        if self.version not in (2, 3):
            if int.from_bytes(self.version.to_bytes(4, "little"), "big") in (2, 3):
                raise GGUFError("big-endian GGUF files are not supported")
            raise GGUFError(f"unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors, n_kv = p.scalar(10), p.scalar(10)
        for i in range(n_kv):
            p.where = f"metadata entry {i}"
            key = p.string()
            if not key or len(key) > MAX_KEY_BYTES:
                raise GGUFError(f"metadata entry {i} has a key of {len(key)} bytes")
            p.where = f"metadata key {key!r}"
            if key in self.metadata:
                raise GGUFError(f"duplicate metadata key {key!r}")
            self.metadata[key] = p.value(p.scalar(4))

        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"general.alignment must be a power of two, got {alignment!r}")
        self.alignment: int = alignment

        infos: list[tuple[str, tuple[int, ...], int, int]] = []
        for i in range(n_tensors):
            p.where = f"tensor info {i}"
            name = p.string()
            if not name or len(name.encode("utf-8", "surrogateescape")) >= GGML_MAX_NAME:
                raise GGUFError(
                    f"tensor info {i}: name of {len(name)} bytes (1 to {GGML_MAX_NAME - 1})"
                )
            p.where = f"tensor info of {name!r}"
            n_dims = p.scalar(4)
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                raise GGUFError(f"tensor {name!r} has {n_dims} dims (1 to {GGML_MAX_DIMS})")
            ne = [p.scalar(10) for _ in range(n_dims)]
            if min(ne) < 1 or math.prod(ne) > MAX_ELEMENTS:
                raise GGUFError(
                    f"tensor {name!r} has dims {ne}: each must be positive, their product at "
                    f"most 2^48"
                )
            infos.append((name, tuple(reversed(ne)), p.scalar(4), p.scalar(10)))

        self.data_offset: int = -(-p.pos // alignment) * alignment
        for name, shape, ggml_type, rel in infos:
            self.tensors[name] = self._check_tensor(name, shape, ggml_type, rel, size)
        self._check_layout()

    def _check_layout(self) -> None:
        """The tensors tile the data section: in offset order, each starts where the one
        before ends (padded to the alignment), as llama.cpp's reader requires (it also wants
        table order). Two tensors that alias, a gap (a tensor whose type was changed to a
        smaller one) or a tensor of another file's layout are refused."""
        expect = self.data_offset
        a = self.alignment
        for info in sorted(self.tensors.values(), key=lambda t: t.offset):
            if info.offset != expect:
                what = "overlaps the tensor before it" if info.offset < expect else "leaves a gap"
                raise GGUFError(
                    f"tensor {info.name!r} starts at data offset {info.offset - self.data_offset},"
                    f" expected {expect - self.data_offset}: it {what} (wrong type, shape or "
                    f"offset in the tensor table)"
                )
            expect = info.offset + -(-info.nbytes // a) * a

    def _check_tensor(
        self, name: str, shape: tuple[int, ...], ggml_type: int, rel: int, size: int
    ) -> GGUFTensorInfo:
        if name in self.tensors:
            raise GGUFError(f"duplicate tensor name {name!r}")
        if ggml_type not in GGML_QUANT_SIZES:
            raise GGUFError(f"tensor {name!r} has unknown ggml type id {ggml_type}")
        block, type_size = GGML_QUANT_SIZES[ggml_type]
        if shape and shape[-1] % block:
            raise GGUFError(
                f"tensor {name!r}: row length {shape[-1]} is not a multiple of the "
                f"{type_name(ggml_type)} block size {block}"
            )
        if rel % self.alignment:
            raise GGUFError(f"tensor {name!r}: offset {rel} is not aligned to {self.alignment}")
        nbytes = math.prod(shape) // block * type_size
        offset = self.data_offset + rel
        if offset + nbytes > size:
            raise GGUFError(
                f"tensor {name!r} ({nbytes} bytes at offset {offset}) extends beyond the end "
                f"of the file ({size} bytes): truncated file?"
            )
        return GGUFTensorInfo(name, shape, ggml_type, offset, nbytes)

    def _info(self, name: str) -> GGUFTensorInfo:
        if self._mm is None:
            raise ValueError(f"{self.path}: file is closed")
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes: a read-only uint8 view of the mapping, no copy."""
        info = self._info(name)
        return self._data[info.offset : info.offset + info.nbytes]

    def release(self, name: str) -> None:
        """Drop this process's resident pages of the tensor's bytes (the whole pages inside
        it), once a copy of them is what serves: a later read maps them in again."""
        info = self._info(name)
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        lo = -(-info.offset // page) * page
        hi = (info.offset + info.nbytes) // page * page
        if hi > lo:
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The tensor dequantized to a new tensor of `dtype` and shape `tensors[name].shape`.

        Raises UnsupportedQuantError if its ggml type has no dequantizer.
        """
        info = self._info(name)
        t = dequantize(self.raw(name), info.ggml_type, info.shape, name=name)
        return t if dtype == torch.float32 else t.to(dtype)

    def close(self) -> None:
        """Unmap the file. Arrays still held from `raw` keep the mapping alive until freed."""
        mm, self._mm, self._data = self._mm, None, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
