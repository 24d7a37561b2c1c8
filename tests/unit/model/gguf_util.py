"""A file our GGUF reader parsed against gguf-py's reader of the same file (the oracle): the same
metadata keys, values and types, tensor names, shapes, types, offsets and bytes."""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType as V

from loraserve.model.gguf import GGUFFile


def reader_metadata(r: gguf.GGUFReader) -> dict[str, Any]:
    """The oracle's metadata, without its GGUF.* header pseudo-keys."""
    return {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}


def assert_same_as_reader(ours: GGUFFile, r: gguf.GGUFReader) -> None:
    fields = reader_metadata(r)
    assert list(ours.metadata) == list(fields)
    for key, field in fields.items():
        value, expected = ours.metadata[key], field.contents()
        if field.types[0] == V.ARRAY and field.types[-1] != V.STRING:
            assert isinstance(value, np.ndarray), key
            assert value.dtype == field.parts[field.data[0]].dtype if field.data else True, key
            np.testing.assert_array_equal(value, np.array(expected, dtype=value.dtype), key)
        else:
            assert value == expected and type(value) is type(expected), key
    assert list(ours.tensors) == [t.name for t in r.tensors]
    for t in r.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(int(n) for n in reversed(t.shape))
        assert (info.ggml_type, info.offset, info.nbytes) == (
            t.tensor_type,
            t.data_offset,
            t.n_bytes,
        )
        np.testing.assert_array_equal(ours.raw(t.name), t.data.view(np.uint8).reshape(-1))
