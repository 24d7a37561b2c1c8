"""Issue 31: slot saves are bounded on disk (`--slot-save-max`, MiB of every slot file in
`--slot-save-path`): a save that would pass the budget is refused with an error naming it and
writes nothing; replacing a slot file counts its new size only; other files never count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraserve.engine import slot_io
from loraserve.engine.slot_io import SlotFileError, SlotImage

FP = {"arch": "test"}


def image(n: int) -> SlotImage:
    """A one-layer slot of ``n`` tokens: n*8 bytes of tokens, 2*n*16 bytes of KV."""
    kv = [(torch.zeros(n, 1, 4), torch.ones(n, 1, 4))]
    return SlotImage(list(range(n)), (), kv)


def payload(n: int) -> int:
    return n * 8 + 2 * n * 16


def test_a_save_past_the_budget_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    budget = payload(10) + payload(6) + 4096  # room for the files' headers too
    slot_io.write(tmp_path / "a.bin", image(10), FP, budget)
    (tmp_path / "notes.txt").write_bytes(b"x" * 10**6)  # the operator's file: not counted
    held = (tmp_path / "a.bin").stat().st_size
    big = (budget - held) // 40 + 1  # its tensors alone pass what is left
    with pytest.raises(SlotFileError, match=r"b\.bin: .*--slot-save-max"):
        slot_io.write(tmp_path / "b.bin", image(big), FP, budget)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "notes.txt"]
    slot_io.write(tmp_path / "b.bin", image(6), FP, budget)  # fits beside a.bin


def test_replacing_a_slot_counts_its_new_size_only(tmp_path: Path) -> None:
    budget = payload(30) * 3 // 2  # one file and its header, not two
    slot_io.write(tmp_path / "s.bin", image(30), FP, budget)
    slot_io.write(tmp_path / "s.bin", image(30), FP, budget)  # the old file no longer counts
    with pytest.raises(SlotFileError):
        slot_io.write(tmp_path / "t.bin", image(30), FP, budget)
    assert slot_io.write(tmp_path / "t.bin", image(30), FP, -1) > 0  # -1: no limit
