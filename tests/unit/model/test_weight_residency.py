"""A large mapped matrix (an output matrix) is packed a block of rows at a time, each block's
mapped pages released as its copy is made (`WeightSource._pack_in_blocks`), so the file's
pages and the packed copy are never both resident whole. The result must be the very bytes
of packing it whole, read back as the file's rows, with the same products."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import loraserve.kernels as K
from loraserve.model import weights as W
from loraserve.model.gguf import GGUFFile
from loraserve.model.gguf_write import write_gguf
from loraserve.model.projection import matmul

pytestmark = pytest.mark.skipif(K.backend() != "c", reason="packed rows need the C kernels")

Q8_0, Q4_K = 8, 12


def _file(tmp_path: Path, rows: int, typ: int) -> Path:
    rng = np.random.default_rng(rows)
    w = rng.standard_normal((rows, 256)).astype(np.float32)
    return write_gguf(tmp_path / "m.gguf", {"general.architecture": "llama"},
                      {"output.weight": w}, {"output.weight": typ})  # fmt: skip


def _source(path: Path) -> W.WeightSource:
    cfg = SimpleNamespace(permuted_qk=False)
    return W.WeightSource(GGUFFile(path), cfg, "native")  # type: ignore[arg-type]


@pytest.mark.parametrize("typ", [Q8_0, Q4_K])
def test_blockwise_pack_equals_whole_pack(tmp_path: Path, typ: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = _file(tmp_path, 1000, typ)
    whole = _source(path).matrix("output.weight")
    assert whole is not None and whole.packed
    rb = whole.row_bytes
    monkeypatch.setattr(W, "PACK_CHUNK", rb * 24)  # blocks of 24 rows, a last one of 16
    src = _source(path)
    blocks = src.matrix("output.weight")
    assert blocks is not None and blocks.packed and blocks.row_bytes == rb
    assert torch.equal(blocks.data, whole.data)
    file_rows = torch.from_numpy(np.array(GGUFFile(path).raw("output.weight"))).view(1000, rb)
    assert torch.equal(blocks.file_rows(), file_rows)  # the file's own bytes, unpacked
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    assert torch.equal(matmul(x, blocks), matmul(x, whole))


def test_rows_without_packed_groups_stay_as_stored(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = _file(tmp_path, 1001, Q8_0)  # not whole groups of 8 rows: no packed kernel
    monkeypatch.setattr(W, "PACK_CHUNK", 1024)
    m = _source(path).matrix("output.weight")
    assert m is not None and not m.packed
    raw = np.array(GGUFFile(path).raw("output.weight"))
    assert torch.equal(m.data.reshape(-1), torch.from_numpy(raw))


def test_release_of_a_byte_range_keeps_the_values(tmp_path: Path) -> None:
    path = _file(tmp_path, 1000, Q8_0)
    g = GGUFFile(path)
    before = np.array(g.raw("output.weight"))
    g.release("output.weight", 4096, 200_000)
    g.release("output.weight", 100, 50)  # an empty range
    g.release("output.weight", 0, 10**12)  # past the end: up to the end
    assert np.array_equal(np.array(g.raw("output.weight")), before)
