"""loraserve's GGUF writer read back by the gguf package, and its refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf import quants

from loraserve.model.dequant import GGML_TYPE
from loraserve.model.gguf import GGUFFile
from loraserve.model.gguf_write import write_gguf
from tests.unit.model.gguf_util import assert_same_as_reader, reader_metadata

RNG = np.random.default_rng(0)


def test_writer_output_reads_back_in_gguf_py(tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    x = torch.randn(8, 64)
    tensors: dict[str, Any] = {
        "blk.0.attn_q.weight.lora_a": torch.randn(4, 64),
        "blk.0.attn_q.weight.lora_b": torch.randn(64, 4).half(),
        "bf16": torch.randn(3, 32).bfloat16(),
        "bf16_from_f32": x,
        "q8": x,
        "vec": np.arange(5, dtype=np.float32),
    }
    metadata = {
        "general.architecture": "gemma3", "general.type": "adapter", "adapter.type": "lora",
        "adapter.lora.alpha": 16.0, "general.alignment": 64, "x.small": -7, "x.big": 1 << 40,
        "x.bool": False, "x.ints": [1, -2, 3], "x.floats": [1, 2.5], "x.strs": ["a", "▁b", ""],
        "x.u8": np.uint8(3), "x.f64": np.float64(0.1), "x.arr": np.array([1, 2], np.uint16),
    }  # fmt: skip
    types = {"q8": GGML_TYPE["Q8_0"], "bf16_from_f32": GGML_TYPE["BF16"]}
    assert write_gguf(path, metadata, tensors, types) == path
    assert [p.name for p in tmp_path.iterdir()] == ["adapter.gguf"]

    r = gguf.GGUFReader(path)
    fields = reader_metadata(r)
    expected_types = {
        "adapter.lora.alpha": [V.FLOAT32], "general.alignment": [V.UINT32],
        "x.small": [V.INT32], "x.big": [V.INT64], "x.bool": [V.BOOL],
        "x.ints": [V.ARRAY, V.INT32], "x.floats": [V.ARRAY, V.FLOAT32],
        "x.strs": [V.ARRAY, V.STRING], "x.u8": [V.UINT8], "x.f64": [V.FLOAT64],
        "x.arr": [V.ARRAY, V.UINT16], "general.type": [V.STRING],
    }  # fmt: skip
    for key, vtypes in expected_types.items():
        assert fields[key].types == vtypes, key
    for key, value in metadata.items():
        got = fields[key].contents()
        assert got == (value.tolist() if hasattr(value, "tolist") else value), key
    with GGUFFile(path) as ours:
        assert_same_as_reader(ours, r)
    by_name = {t.name: t for t in r.tensors}
    for name in ("blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b", "vec"):
        np.testing.assert_array_equal(by_name[name].data, np.asarray(tensors[name]))
    bf16 = tensors["bf16"].view(torch.int16).numpy().view(np.uint8)
    np.testing.assert_array_equal(by_name["bf16"].data.reshape(-1), bf16.reshape(-1))
    for name, qtype in (("q8", Q.Q8_0), ("bf16_from_f32", Q.BF16)):
        assert by_name[name].tensor_type == qtype
        np.testing.assert_array_equal(by_name[name].data, quants.quantize(x.numpy(), qtype))
    assert [int(n) for n in by_name["q8"].shape] == [64, 8]


def test_q8_0_matches_reference_on_ties_zeros_and_extremes(tmp_path: Path) -> None:
    ties = np.array([127, 63.5, -63.5, 0.5, -0.5, 1.5, -2.5] + [0] * 25, np.float32)
    x = np.stack([ties, np.zeros(32, np.float32), np.full(32, -3e38, np.float32)])
    x = np.concatenate([x, RNG.standard_normal((5, 32)).astype(np.float32) * 1e-3])
    write_gguf(tmp_path / "q.gguf", {}, {"q": x}, {"q": GGML_TYPE["Q8_0"]})
    with GGUFFile(tmp_path / "q.gguf") as f:
        with np.errstate(over="ignore"):
            expected = quants.quantize(x, Q.Q8_0)
        np.testing.assert_array_equal(f.raw("q").reshape(8, 34), expected)


def test_writer_roundtrip_nested_arrays_and_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "a.gguf"
    path.write_bytes(b"old")
    write_gguf(path, {"n": [[1, 2], ["x"]], "e": np.zeros(0, np.float32)}, {})
    with GGUFFile(path) as f:
        assert f.tensors == {}
        (a, b), e = f.metadata["n"], f.metadata["e"]
        assert a.tolist() == [1, 2] and b == ["x"] and e.dtype == np.float32 and e.size == 0


@pytest.mark.parametrize(
    ("metadata", "tensors", "types", "message"),
    [
        ({"k": []}, {}, None, "'k': empty list"),
        ({"k": {"a": 1}}, {}, None, "cannot store a dict"),
        ({"k": [1, "a"]}, {}, None, "one kind"),
        ({"general.alignment": 48}, {}, None, "power of two"),
        ({}, {"w": torch.zeros(2, dtype=torch.int32)}, None, "'w': no default GGUF type"),
        ({}, {"w": torch.zeros(2, 16)}, {"w": 8}, "'w': Q8_0 needs rows of a multiple of 32"),
        ({}, {"w": torch.zeros(2, 32)}, {"w": 10}, "'w': cannot write type Q2_K"),
        ({}, {"w": torch.zeros(2, 32)}, {"w": 12}, "'w': rows of 32 are not whole blocks"),
        ({}, {}, {"w": 8}, r"not given: \['w'\]"),
    ],
)
def test_writer_errors_leave_nothing_behind(
    tmp_path: Path, metadata: Any, tensors: Any, types: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        write_gguf(tmp_path / "x.gguf", metadata, tensors, types)
    assert list(tmp_path.iterdir()) == []
