"""qwen35moe and qwen3next read their FFN keys as llama.cpp does: ``feed_forward_length`` is
optional (no layer has a dense FFN; Hugging Face configs without ``intermediate_size`` convert
without it), and the routed experts' width is ``expert_feed_forward_length``, else
``feed_forward_length / expert_used_count``. Files that differ only in how they state the
width load to the same model (bit-identical logits); a file stating neither is refused with
one line naming both keys. The files are `test-llama-archs`'s recorded tiny models
(tests/data/archs), whose experts are 384 wide with 2 used."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.model.archs import UnsupportedModelError
from loraserve.model.loader import load_model
from tests.arch_models import write_model

DATA = Path(__file__).resolve().parents[2] / "data" / "archs"
ARCHS = ("qwen35moe", "qwen3next")


def spec(arch: str, drop: tuple[str, ...] = (), put: dict[str, int] | None = None) -> dict:
    """The recorded moe variant without the `drop` keys and with `put`'s UINT32 values."""
    s: dict[str, Any] = copy.deepcopy(json.loads((DATA / f"{arch}.json").read_text()))
    s = s["variants"]["moe"]
    names = {f"{arch}.{k}" for k in (*drop, *(put or {}))}
    s["metadata"] = [m for m in s["metadata"] if m[0] not in names]
    s["metadata"] += [[f"{arch}.{k}", "UINT32", v] for k, v in (put or {}).items()]
    return s


def logits(s: dict[str, Any], path: Path) -> tuple[int, torch.Tensor]:
    """The loaded experts' width and the logits of one 5-token prompt."""
    m = load_model(write_model(s, path))
    runner = ModelRunner(m.decoder, 4, torch.float32)
    runner.ensure_capacity(2)
    out = runner.forward([BatchItem([5, 9, 77, 3, 12], 0, 5, [0, 1], True, {})])
    return m.config.expert_ffn_dim, out


@pytest.mark.parametrize("arch", ARCHS)
def test_either_key_gives_the_same_model(tmp_path: Path, arch: str) -> None:
    width, ref = logits(spec(arch), tmp_path / "as_recorded.gguf")
    assert width == 384
    variants = {
        "no_feed_forward_length": spec(arch, drop=("feed_forward_length",)),
        "width_from_n_ff": spec(
            arch, drop=("expert_feed_forward_length",), put={"feed_forward_length": 768}
        ),
    }
    for name, s in variants.items():
        w, out = logits(s, tmp_path / f"{name}.gguf")
        assert w == 384, name
        assert torch.equal(out, ref), name


@pytest.mark.parametrize("arch", ARCHS)
def test_no_width_key_is_refused_by_name(tmp_path: Path, arch: str) -> None:
    s = spec(arch, drop=("feed_forward_length", "expert_feed_forward_length"))
    with pytest.raises(UnsupportedModelError, match=rf"{arch}\.expert_feed_forward_length"):
        load_model(write_model(s, tmp_path / "neither.gguf"))


def test_a_dense_architecture_still_needs_feed_forward_length(tmp_path: Path) -> None:
    s = json.loads((DATA / "qwen35.json").read_text())
    s = s["variants"][next(iter(s["variants"]))]
    s["metadata"] = [m for m in s["metadata"] if m[0] != "qwen35.feed_forward_length"]
    with pytest.raises(UnsupportedModelError, match=r"lacks qwen35\.feed_forward_length"):
        load_model(write_model(s, tmp_path / "dense.gguf"))
