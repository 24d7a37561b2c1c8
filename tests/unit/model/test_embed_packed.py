"""Token embedding rows looked up in a tied output's packed copy (`RowEmbedding.read_packed`):
the same bytes as the file's rows, and the file's pages of the table are not mapped in."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from loraserve import kernels
from loraserve.kernels import pack_rows
from loraserve.model.layers import RowEmbedding

pytestmark = pytest.mark.skipif(kernels.backend() != "c", reason="packing needs the C kernels")

# (ggml type, values per block, bytes per block, the byte offsets of f16 scales to tame)
TYPES = {"Q8_0": (8, 32, 34, (1,)), "Q4_K": (12, 256, 144, (1, 3)), "Q6_K": (14, 256, 210, (209,))}


def _rows(gtype: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    t, bs, size, scales = TYPES[gtype]
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n, k // bs * size), dtype=torch.uint8, generator=g)
    for b in scales:  # finite f16 scales (high byte without the exponent's top bits)
        raw.view(n, -1, size)[:, :, b] &= 0x3B
    return raw


@pytest.mark.parametrize("gtype", list(TYPES))
def test_packed_lookup_equals_file_rows(gtype: str) -> None:
    t, k, n = TYPES[gtype][0], 512, 96
    raw = _rows(gtype, n, k)
    plain = RowEmbedding(raw, t, k)
    packed = RowEmbedding(raw, t, k)
    p = pack_rows(raw, t, k)
    assert p is not None
    packed.read_packed(p)
    for ids in ([5], [0, 95, 5, 5, 17, 16, 94], list(range(n)), [40] * 3):
        x = torch.tensor(ids)
        assert torch.equal(packed(x), plain(x))


def _mapped_kib(addr: int) -> int:
    """Rss of the mapping holding `addr` (this process's smaps)."""
    rss, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "Rss:":
            rss = int(line.split()[1])
    return rss


def test_packed_lookup_leaves_the_file_unmapped(tmp_path: Path) -> None:
    t, k, n = TYPES["Q6_K"][0], 512, 4096  # a 1.7 MiB table: 420 bytes a row
    raw = _rows("Q6_K", n, k, seed=1)
    path = tmp_path / "table.bin"
    path.write_bytes(raw.numpy().tobytes())
    with path.open("rb") as f:
        mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    view = torch.frombuffer(mm, dtype=torch.uint8).view(n, -1)  # read-only, never written
    emb = RowEmbedding(view, t, k)
    p = pack_rows(raw, t, k)
    assert p is not None
    emb.read_packed(p)
    ids = torch.arange(0, n, 97)  # rows far apart: each a page of its own
    assert torch.equal(emb(ids), RowEmbedding(raw, t, k)(ids))
    assert _mapped_kib(view.data_ptr()) == 0  # the old lookup faulted in 64 KiB a row
