"""Weight buffers on huge pages (`kernels.hugebuf`) and expert stacks packed into one
(`routed._pack_stack`): the same bytes as packing each expert alone."""

from __future__ import annotations

import pytest
import torch

from loraserve import kernels
from loraserve.kernels import hugebuf
from loraserve.model.ffn.routed import _pack_stack
from loraserve.model.projection import Matrix

Q4_K, Q5_0 = 12, 6


def _thp_eligible(t: torch.Tensor) -> bool | None:
    """smaps' THPeligible of the mapping holding t's first byte (None: not readable here)."""
    try:
        text = open("/proc/self/smaps").read()
    except OSError:
        return None
    addr, eligible = t.data_ptr(), None
    for line in text.splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "THPeligible:":
            eligible = line.split()[1] == "1"
    return eligible


def test_large_buffer_is_aligned_and_holds_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORASERVE_HUGEPAGES", "1")
    t = hugebuf.empty_u8(300, 10_000)
    assert t.shape == (300, 10_000) and t.dtype == torch.uint8 and t.is_contiguous()
    if hugebuf.enabled():
        assert t.data_ptr() % hugebuf.HUGE == 0
        assert _thp_eligible(t) in (True, None)
    src = torch.randint(0, 256, (300, 10_000), dtype=torch.uint8)
    t.copy_(src)
    assert torch.equal(t, src)


def test_huge_pages_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default a large buffer is its own mapping (freed whole with the tensor) but not
    advised for huge pages: fresh huge pages cost seconds at load on a VM whose balloon
    reports free memory (the module doc)."""
    monkeypatch.delenv("LORASERVE_HUGEPAGES", raising=False)
    monkeypatch.delenv("LORASERVE_NO_HUGEPAGES", raising=False)
    assert not hugebuf.enabled()
    t = hugebuf.empty_u8(300, 10_000)
    assert t.data_ptr() % hugebuf.HUGE == 0  # its own mapping, not the heap
    assert _thp_eligible(t) in (False, None) or _thp_always()
    t.fill_(7)
    assert int(t.sum()) == 7 * 300 * 10_000


def _thp_always() -> bool:
    try:
        return "[always]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


def test_small_buffer_and_switch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert hugebuf.empty_u8(4, 100).shape == (4, 100)
    monkeypatch.setenv("LORASERVE_HUGEPAGES", "1")
    monkeypatch.setenv("LORASERVE_NO_HUGEPAGES", "1")
    assert not hugebuf.enabled()
    assert hugebuf.empty_u8(300, 10_000).shape == (300, 10_000)


@pytest.mark.skipif(kernels.backend() != "c", reason="packing needs the C kernels")
@pytest.mark.parametrize(("gtype", "block", "size"), [(Q4_K, 256, 144), (Q5_0, 32, 22)])
def test_stack_packed_in_one_buffer_equals_each_alone(gtype: int, block: int, size: int) -> None:
    n, k, e = 64, 512, 5
    g = torch.Generator().manual_seed(gtype)
    mats = []
    for _ in range(e):
        raw = torch.randint(0, 256, (n, k // block * size), dtype=torch.uint8, generator=g)
        if gtype == Q5_0:  # finite f16 scales: the first two bytes of each block
            raw.view(n, -1, size)[:, :, 1] &= 0x3B
        else:  # d and dmin of each super-block
            raw.view(n, -1, size)[:, :, 1] &= 0x3B
            raw.view(n, -1, size)[:, :, 3] &= 0x3B
        mats.append(Matrix("blk.0.ffn_up_exps.weight", raw, gtype, (n, k)))
    stacked = _pack_stack(mats)
    alone = [m.pack() for m in mats]
    assert all(s.packed and a.packed for s, a in zip(stacked, alone, strict=True))
    for s, a in zip(stacked, alone, strict=True):
        assert s.kernel_type == a.kernel_type and s.row_bytes == a.row_bytes
        assert torch.equal(s.data, a.data)
    # one buffer: expert e's rows follow expert e - 1's
    step = stacked[1].data.data_ptr() - stacked[0].data.data_ptr()
    assert step == n * stacked[0].data.shape[1]
