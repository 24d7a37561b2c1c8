"""`AdapterGGUF`: the model reader (`model.gguf.GGUFFile`) with a fast path for the header of
a well-formed file, which adapters are: a first use of an adapter parses its ~250-entry
tensor table once per read, on the CPU the engine decodes on.

The fast path reads the tensor table in one loop of unpacks (`gguf_parse.plain_tensor_table`)
and checks every record in the same loop as the checked reader does (`GGUFFile._check_tensor`
and `_check_layout`: names unique, known types, whole blocks, aligned offsets inside the
file, tensors tiling the data section in table order). It accepts exactly the headers the
checked reader accepts, with the same metadata and table; at the first thing it does not
accept it stops, and the checked reader reads the file from the start and raises its own
error (so every refusal is the model reader's, word for word). A valid file whose tensors
tile the data section in another order than the table's takes the checked reader too.
"""

from __future__ import annotations

import math
from typing import Any

from loraserve.model.dequant import GGML_QUANT_SIZES
from loraserve.model.gguf import GGUFFile, GGUFTensorInfo
from loraserve.model.gguf_parse import (
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    MAX_KEY_BYTES,
    GGUFError,
    _Parser,
    plain_tensor_table,
)


class AdapterGGUF(GGUFFile):
    """A `GGUFFile` whose header parse takes the fast path when it can (module docstring)."""

    def _parse(self, size: int) -> None:
        if not self._plain(size):
            self.metadata, self.tensors = {}, {}
            super()._parse(size)

    def _plain(self, size: int) -> bool:
        """Parse a header the fast way; False (nothing set) at anything unusual."""
        mm = self._mm
        if mm is None or mm[:4] != GGUF_MAGIC:
            return False
        p = _Parser(mm, size)
        p.pos = 4
        meta: dict[str, Any] = {}
        try:
            version = p.scalar(4)
            if version not in (2, 3):
                return False
            n_tensors, n_kv = p.scalar(10), p.scalar(10)
            for _ in range(n_kv):
                key = p.string()
                if not key or len(key) > MAX_KEY_BYTES or key in meta:
                    return False
                meta[key] = p.value(p.scalar(4))
        except GGUFError:
            return False
        align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            return False
        table = plain_tensor_table(mm, p.pos, size, n_tensors)
        if table is None:
            return False
        records, end = table
        data_offset = -(-end // align) * align
        tensors: dict[str, GGUFTensorInfo] = {}
        expect = data_offset  # where the next tensor must start (table order)
        for name, shape, ggml_type, rel in records:
            quant = GGML_QUANT_SIZES.get(ggml_type)
            if quant is None or name in tensors or shape[-1] % quant[0] or rel % align:
                return False
            nbytes = math.prod(shape) // quant[0] * quant[1]
            offset = data_offset + rel
            if offset != expect or offset + nbytes > size:
                return False
            tensors[name] = GGUFTensorInfo(name, shape, ggml_type, offset, nbytes)
            expect = offset + -(-nbytes // align) * align
        self.version, self.metadata, self.tensors = version, meta, tensors
        self.alignment, self.data_offset = align, data_offset
        return True
