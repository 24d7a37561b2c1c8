"""A fast GGUF reader: header, metadata and tensor table parsed with `struct`, data memory-mapped.

GGUF (v2, v3; little-endian) is: magic `GGUF`, version u32, tensor count u64, metadata count u64,
the metadata key/value pairs, one info record per tensor (name, dims in ggml order, type, offset
relative to the data section), padding to `general.alignment`, then the tensor data.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .dequant import GGML_QUANT_SIZES, dequantize, type_name
from .gguf_parse import (  # GGUFError is re-exported: importers catch gguf.GGUFError
    DEFAULT_ALIGNMENT,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGUF_MAGIC,
    MAX_ELEMENTS,
    MAX_KEY_BYTES,
    GGUFError,
    _Parser,
)

# The last parsed header, handed once to the next open of the same file (same device, inode,
# size and modification time, and the same header bytes): start-up checks the header, then
# loads the model, and Gemma's 262,144-token vocabulary takes ~0.4 s to parse. Metadata and
# tensor table are read-only.
_LAST_HEADER: dict[tuple[int, int, int, int], tuple[Any, ...]] = {}


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor's entry in the tensor table."""

    name: str
    shape: tuple[int, ...]  # torch order: reversed ggml ne
    ggml_type: int
    offset: int  # absolute file offset of the data
    nbytes: int


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

    def release(self, name: str, start: int = 0, end: int | None = None) -> None:
        """Drop this process's resident pages of the tensor's bytes ``start .. end`` (default
        all; the whole pages inside them), once a copy of them is what serves: a later read
        maps them in again."""
        info = self._info(name)
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        stop = info.nbytes if end is None else min(end, info.nbytes)
        lo = -(-(info.offset + max(start, 0)) // page) * page
        hi = (info.offset + stop) // page * page
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
