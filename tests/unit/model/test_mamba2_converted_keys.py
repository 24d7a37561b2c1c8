"""mamba2 files as llama.cpp's converter writes them (`conversion/mamba.py`): head_count 0 and
feed_forward_length 0 ("unused, but seemingly required when loading") and no head_count_kv.
llama.cpp loads them; so does loraserve (they were refused: "feed_forward_length = 0: must be
an integer from 1"), with the same logits as the template's file that sets those sizes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.model.loader import load_model
from tests.arch_models import write_model

DATA = Path(__file__).resolve().parents[2] / "data" / "archs" / "recurrent" / "mamba2.json"


def _logits(path: Path) -> torch.Tensor:
    runner = ModelRunner(load_model(path).decoder, 4, torch.float32)
    runner.ensure_capacity(2)
    return runner.forward([BatchItem([5, 9, 77, 3, 12], 0, 5, [0, 1], True, {})])


def test_converted_mamba2_keys_load_and_run_alike(tmp_path: Path) -> None:
    spec = json.loads(DATA.read_text())["variants"]["dense"]
    conv = copy.deepcopy(spec)
    unused = {"mamba2.attention.head_count", "mamba2.attention.head_count_kv",
              "mamba2.feed_forward_length"}  # fmt: skip
    conv["metadata"] = [m for m in conv["metadata"] if m[0] not in unused] + [
        ["mamba2.attention.head_count", "UINT32", 0],
        ["mamba2.feed_forward_length", "UINT32", 0],
    ]
    want = _logits(write_model(spec, tmp_path / "template.gguf"))
    got = _logits(write_model(conv, tmp_path / "converted.gguf"))
    assert torch.equal(got, want)
