"""The adapter reader's fast header path (`lora.adapter_gguf.AdapterGGUF`) against the
model reader (`model.gguf.GGUFFile`) as the oracle: on well-formed adapters and on
hundreds of mutated ones (the file fuzzer's structure-aware mutations), both give the same
header (version, metadata, tensor table, alignment, data offset) or the same error, word
for word; the fast path is the one taken on a well-formed adapter."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

import loraserve.model.gguf as gguf_mod
from loraserve.lora.adapter_gguf import AdapterGGUF
from loraserve.model.gguf import GGUFFile
from tests.hardening.fuzz_gguf import fields, mutate
from tests.hardening.seed_files import ADAPTERS, tiny_lora
from tests.unit.lora.lora_util import gguf_adapter


def _seeds(folder: Path) -> dict[str, Path]:
    g = torch.Generator().manual_seed(3)
    t = {f"blk.{i}.attn_{p}.weight.lora_{h}": torch.randn(*s, generator=g)
         for i in range(3) for p in "qv" for h, s in (("a", (4, 64)), ("b", (64, 4)))}  # fmt: skip
    return {
        "tiny_lora": tiny_lora(folder / "tiny_lora.gguf"),
        "demo": ADAPTERS / "titlecase.gguf",
        "f16": gguf_adapter(folder / "f16.gguf", "llama", t, types=dict.fromkeys(t, Q.F16)),
    }


def _plain(v: Any) -> Any:
    """A metadata value in a form == compares (arrays by value, floats by repr: NaN)."""
    if isinstance(v, np.ndarray):
        return str(v.dtype), v.tobytes()
    return repr(v) if isinstance(v, float) else v


def _outcome(cls: type[GGUFFile], path: Path) -> tuple[Any, ...]:
    gguf_mod._LAST_HEADER.clear()  # no header handed over from the other reader's open
    try:
        with cls(path) as gg:
            meta = {k: _plain(v) for k, v in gg.metadata.items()}
            return (gg.version, meta, gg.tensors, gg.alignment, gg.data_offset)
    except Exception as e:  # the exact error is the outcome compared
        return (type(e).__name__, str(e))


def test_same_header_or_error_as_the_model_reader(tmp_path) -> None:
    rng = random.Random(29)
    n = same_ok = 0
    for name, seed in _seeds(tmp_path).items():
        data = seed.read_bytes()
        table, end = fields(data)
        assert _outcome(AdapterGGUF, seed) == _outcome(GGUFFile, seed)
        for i in range(250):
            case = tmp_path / f"{name}-{i}.gguf"
            case.write_bytes(mutate(data, table, end, rng))
            want = _outcome(GGUFFile, case)
            assert _outcome(AdapterGGUF, case) == want, (name, i)
            n += 1
            same_ok += len(want) == 5
    assert n == 750 and 50 < same_ok < 700  # both outcomes well represented


def test_fast_path_taken_on_a_well_formed_adapter(tmp_path, monkeypatch) -> None:
    checked = []
    real = GGUFFile._parse
    monkeypatch.setattr(GGUFFile, "_parse", lambda gg, size: checked.append(1) or real(gg, size))
    for seed in _seeds(tmp_path).values():
        gguf_mod._LAST_HEADER.clear()
        with AdapterGGUF(seed) as gg:
            assert gg.tensors
    assert not checked


@pytest.mark.parametrize("swap", [False, True])
def test_tensors_out_of_table_order(tmp_path, swap: bool) -> None:
    """Two tensors of one size with their offsets swapped tile the data section in another
    order than the table's: the checked reader takes it (the fast path hands it over) and
    both readers agree; an offset that overlaps is refused by both, with one message."""
    path = _seeds(tmp_path)["f16"]
    data = bytearray(path.read_bytes())
    offsets = [f for f in fields(bytes(data))[0] if f.role == "toffset"]
    a, b = offsets[0], offsets[2]  # two A tensors of one shape
    va, vb = (struct.unpack_from("<Q", data, f.offset)[0] for f in (a, b))
    struct.pack_into("<Q", data, a.offset, vb)
    struct.pack_into("<Q", data, b.offset, vb if not swap else va)
    case = tmp_path / "swapped.gguf"
    case.write_bytes(bytes(data))
    want = _outcome(GGUFFile, case)
    assert _outcome(AdapterGGUF, case) == want
    assert (len(want) == 5) == swap, want
