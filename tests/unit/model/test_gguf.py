"""The GGUF reader and writer agree with gguf-py's GGUFReader/GGUFWriter (the oracle)."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf import quants

from loraserve.model.dequant import UnsupportedQuantError
from loraserve.model.gguf import GGUFError, GGUFFile
from loraserve.model.gguf_write import write_gguf
from tests.unit.model.gguf_util import assert_same_as_reader

RNG = np.random.default_rng(0)
SCALARS = {
    V.UINT8: 200, V.INT8: -100, V.UINT16: 60000, V.INT16: -30000, V.UINT32: 4_000_000_000,
    V.INT32: -2_000_000_000, V.FLOAT32: 0.1, V.UINT64: 2**63 + 5, V.INT64: -(2**62),
    V.FLOAT64: 0.1, V.BOOL: True, V.STRING: "héllo ▁ wörld",
}  # fmt: skip
NUMPY = {V.UINT8: np.uint8, V.INT8: np.int8, V.UINT16: np.uint16, V.INT16: np.int16,
         V.UINT32: np.uint32, V.INT32: np.int32, V.FLOAT32: np.float32, V.UINT64: np.uint64,
         V.INT64: np.int64, V.FLOAT64: np.float64, V.BOOL: np.bool_}  # fmt: skip


def assert_dequant_matches(ours: GGUFFile, t: Any) -> None:
    with np.errstate(all="ignore"):
        ref = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    got = ours.tensor(t.name)  # info.shape, float32
    assert tuple(got.shape) == ours.tensors[t.name].shape
    np.testing.assert_array_equal(
        got.numpy().reshape(-1).view(np.uint32), ref.reshape(-1).view(np.uint32)
    )


def write_with_gguf_py(path: Path, alignment: int | None = None) -> None:
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    for vtype, value in SCALARS.items():
        w.add_key_value(f"scalar.{vtype.name.lower()}", value, vtype)
    for vtype, dtype in NUMPY.items():
        values = [True, False, True] if vtype == V.BOOL else np.arange(1, 4).astype(dtype).tolist()
        w.add_key_value(f"array.{vtype.name.lower()}", values, V.ARRAY, sub_type=vtype)
    w.add_array("array.string", ["<pad>", "▁the", "", "\n\n", "é"])
    w.add_tensor("f32", RNG.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", RNG.standard_normal((4, 6)).astype(np.float16))
    w.add_tensor("norm", RNG.standard_normal(7).astype(np.float32))
    x = RNG.standard_normal((6, 64)).astype(np.float32)
    for qtype in (Q.Q8_0, Q.Q4_0, Q.Q5_1, Q.BF16):
        w.add_tensor(qtype.name.lower(), quants.quantize(x, qtype), raw_dtype=qtype)
    for qtype, size, halves in ((Q.Q4_K, 144, 0), (Q.Q6_K, 210, 208), (Q.NVFP4, 36 * 4, 0)):
        raw = RNG.integers(0, 256, (2, size), dtype=np.uint8)
        raw[:, halves : halves + 4 if qtype == Q.Q4_K else halves + 2] = 60  # finite f16 scales
        w.add_tensor(qtype.name.lower(), raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture()
def oracle_file(tmp_path: Path) -> Path:
    path = tmp_path / "oracle.gguf"
    write_with_gguf_py(path)
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_reads_what_gguf_py_writes(tmp_path: Path, alignment: int | None) -> None:
    path = tmp_path / "m.gguf"
    write_with_gguf_py(path, alignment)
    r = gguf.GGUFReader(path)
    with GGUFFile(path) as ours:
        assert ours.version == 3
        assert_same_as_reader(ours, r)
        assert ours.metadata["scalar.float32"] == float(np.float32(0.1))
        assert ours.metadata["array.bool"].dtype == np.bool_
        for t in r.tensors:
            if t.tensor_type != Q.NVFP4:
                assert_dequant_matches(ours, t)
        assert all(info.offset % (alignment or 32) == 0 for info in ours.tensors.values())


def test_reads_v2(oracle_file: Path) -> None:
    data = bytearray(oracle_file.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    oracle_file.write_bytes(bytes(data))
    with GGUFFile(oracle_file) as f:
        assert f.version == 2
        assert f.tensor("f32").shape == (3, 5)


def test_unsupported_tensor_type(oracle_file: Path) -> None:
    with GGUFFile(oracle_file) as f:
        assert f.raw("nvfp4").nbytes == 2 * 36 * 4
        with pytest.raises(UnsupportedQuantError, match=r"'nvfp4'.*NVFP4"):
            f.tensor("nvfp4")
        with pytest.raises(KeyError, match="no tensor named 'nope'"):
            f.raw("nope")
    with pytest.raises(ValueError, match="closed"):
        f.tensor("f32")


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (lambda d: b"GGML" + d[4:], "bad magic b'GGML'"),
        (lambda d: b"", "empty file"),
        (lambda d: d[:3], "bad magic"),
        (lambda d: d[:60], r"truncated file: metadata key 'general.architecture' needs"),
        (lambda d: d[:-100], r"tensor 'nvfp4' .* extends beyond the end of the file"),
        (lambda d: d[:4] + struct.pack("<I", 1) + d[8:], "unsupported GGUF version 1"),
        (lambda d: d[:4] + struct.pack(">I", 3) + d[8:], "big-endian"),
        (lambda d: d.replace(b"llama", b"llam\xff"), None),
    ],
)
def test_bad_files_give_clear_errors(oracle_file: Path, patch: Any, message: str | None) -> None:
    oracle_file.write_bytes(patch(oracle_file.read_bytes()))
    if message is None:  # invalid UTF-8 is kept, escaped, not fatal
        assert GGUFFile(oracle_file).metadata["general.architecture"] == "llam\udcff"
        return
    with pytest.raises(GGUFError, match=message) as e:
        GGUFFile(oracle_file)
    assert str(oracle_file) in str(e.value)


def test_unknown_value_and_tensor_types(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_gguf(path, {"k.v": 1}, {"w": torch.zeros(4)})
    data = path.read_bytes()
    key_type = data.index(b"k.v") + 3
    path.write_bytes(data[:key_type] + struct.pack("<I", 99) + data[key_type + 4 :])
    with pytest.raises(GGUFError, match="unknown metadata value type 99 in metadata key 'k.v'"):
        GGUFFile(path)
    tensor_type = data.index(b"w\x01\x00\x00\x00") + 13
    path.write_bytes(data[:tensor_type] + struct.pack("<I", 77) + data[tensor_type + 4 :])
    with pytest.raises(GGUFError, match="tensor 'w' has unknown ggml type id 77"):
        GGUFFile(path)


@pytest.fixture()
def one_thread() -> Any:
    """One torch thread: on a machine shared with other jobs, torch's thread pool stalls."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def real_reader(real_model_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(real_model_path)


@pytest.mark.real_model
def test_real_model_metadata_and_table(real_model_path: Path, real_reader: Any) -> None:
    start = time.perf_counter()
    with GGUFFile(real_model_path) as f:
        elapsed = time.perf_counter() - start
        print(f"\nopen + metadata + tensor table of {real_model_path.name}: {elapsed * 1e3:.0f} ms")
        assert_same_as_reader(f, real_reader)
        assert f.tensors["token_embd.weight"].shape == (262144, 640)
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 262144
        assert f.metadata["tokenizer.ggml.scores"].dtype == np.float32
        assert f.metadata["tokenizer.ggml.token_type"].dtype == np.int32


@pytest.mark.real_model
def test_real_model_dequantizes_bit_identically(
    real_model_path: Path, real_reader: Any, one_thread: None
) -> None:
    """Every tensor, checked against the (slow) reference in full for the smallest tensor of
    each type and on a sample of 128 rows for the rest."""
    rng = np.random.default_rng(0)
    smallest: dict[int, Any] = {}
    for t in real_reader.tensors:
        if t.tensor_type not in smallest or t.n_bytes < smallest[t.tensor_type].n_bytes:
            smallest[t.tensor_type] = t
    seconds = 0.0
    with GGUFFile(real_model_path) as f:
        for t in real_reader.tensors:
            start = time.perf_counter()
            got = f.tensor(t.name)  # info.shape, float32
            seconds += time.perf_counter() - start
            if t in smallest.values() or t.data.ndim == 1:
                assert_dequant_matches(f, t)
                continue
            rows = np.concatenate([np.arange(64), rng.choice(len(t.data), 64, replace=False)])
            ref = np.asarray(quants.dequantize(t.data[rows], t.tensor_type), dtype=np.float32)
            sample = got.reshape(len(t.data), -1)[rows].numpy()
            np.testing.assert_array_equal(sample.view(np.uint32), ref.view(np.uint32), t.name)
    print(f"\ndequantized {len(real_reader.tensors)} tensors in {seconds:.2f} s")


def test_a_header_parsed_once_is_handed_to_the_next_open_only_if_unchanged(
    oracle_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up checks a model's header, then loads it: the second open takes the parse of
    the first, unless the file's header changed in between (same size and time included)."""
    parses: list[Path] = []
    real = GGUFFile._parse

    def counted(self: GGUFFile, size: int) -> None:
        parses.append(self.path)
        real(self, size)

    monkeypatch.setattr(GGUFFile, "_parse", counted)
    first = GGUFFile(oracle_file)
    second = GGUFFile(oracle_file)
    assert len(parses) == 1
    assert second.metadata == first.metadata and second.tensors == first.tensors
    assert torch.equal(second.tensor("f32"), first.tensor("f32"))
    first.close()
    second.close()
    GGUFFile(oracle_file).close()  # handed over once only: this one parses again
    assert len(parses) == 2
    stat = oracle_file.stat()
    data = bytearray(oracle_file.read_bytes())
    data[4:8] = struct.pack("<I", 2)  # another version, same size and times
    oracle_file.write_bytes(bytes(data))
    os.utime(oracle_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with GGUFFile(oracle_file) as changed:
        assert changed.version == 2
    assert len(parses) == 3


def test_released_pages_read_back_the_same_bytes(tmp_path: Path) -> None:
    """`release` drops the mapping's resident pages of a tensor (once a repacked copy
    serves it); a later read maps the same bytes in again."""
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(path, "llama")
    x = RNG.standard_normal((256, 512)).astype(np.float32)
    w.add_tensor("w", quants.quantize(x, Q.Q8_0), raw_dtype=Q.Q8_0)  # 139 KB: whole pages
    w.add_tensor("after", RNG.standard_normal((3, 5)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = GGUFFile(path)
    before, after = f.raw("w").copy(), f.raw("after").copy()
    f.release("w")
    assert np.array_equal(f.raw("w"), before)
    assert np.array_equal(f.raw("after"), after)  # its neighbour untouched
