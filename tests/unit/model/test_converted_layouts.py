"""GGUF files laid out as llama.cpp's own converter writes them (convert_hf_to_gguf.py on tiny
transformers checkpoints: tests/data/converted/<arch>.json, recorded with their tensor tables
and metadata by scripts/record_converted_layouts.py, which also found their logits equal to
transformers float32 within 1e-5). Each layout, written here by our GGUF writer with random
values, loads and runs; where the converter's keys differ from test-llama-archs' templates in a
way that changes the answer, the file gives the logits of one spelling the keys out."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.model.loader import load_model
from tests.arch_models import write_model

DATA = Path(__file__).resolve().parents[2] / "data"
LAYOUTS = {p.stem: json.loads(p.read_text()) for p in sorted((DATA / "converted").glob("*.json"))}
_VOCAB = [m for m in json.loads((DATA / "archs" / "llama.json").read_text())["variants"]["dense"]
          ["metadata"] if m[0].startswith("tokenizer.")]  # fmt: skip
IDS = [5, 9, 77, 3, 12, 40, 100, 7]


def spec(arch: str, seed: int = 3, stdev: float = 0.05) -> dict[str, Any]:
    """The recorded layout as a writable spec: its keys, the test vocabulary, its tensors
    (F32), random values (Mamba's A decaying)."""
    rec = LAYOUTS[arch]
    return {
        "metadata": copy.deepcopy(rec["metadata"]) + _VOCAB,
        "tensors": [[n, s, 0] for n, s, _ in rec["tensors"]],
        "generator": {"seed": seed, "stdev": stdev, "negative_a": True},
    }


def logits(path: Path) -> torch.Tensor:
    """Float32 logits [len(IDS), V] at every position."""
    runner = ModelRunner(load_model(path).decoder, 4, torch.float32)
    runner.ensure_capacity(2)
    return runner.forward([BatchItem(IDS, 0, len(IDS), [0, 1], True, {}, n_logits=len(IDS))])


def _set(s: dict[str, Any], key: str, vtype: str, value: Any) -> None:
    s["metadata"] = [m for m in s["metadata"] if m[0] != key] + [[key, vtype, value]]


@pytest.mark.parametrize("arch", sorted(LAYOUTS))
def test_converted_layout_loads_and_runs(tmp_path: Path, arch: str) -> None:
    assert LAYOUTS[arch]["converts"] and LAYOUTS[arch]["loads"]
    assert LAYOUTS[arch]["rel_diff"] < 1e-5  # the recording's transformers float32 comparison
    out = logits(write_model(spec(arch), tmp_path / f"{arch}.gguf"))
    assert out.shape == (len(IDS), 128) and torch.isfinite(out).all()


def test_nemotron_h_rms_epsilon_from_layer_norm_epsilon(tmp_path: Path) -> None:
    """The converter writes only ``attention.layer_norm_epsilon`` (1e-5); llama.cpp's
    nemotron-h loader takes it as the RMS norms' epsilon when ``layer_norm_rms_epsilon`` is
    absent (we used 1e-6: 2.3e-2 relative off transformers, 3e-7 now)."""
    s = spec("nemotron_h", stdev=0.02)
    keys = {m[0]: m for m in s["metadata"]}
    assert "nemotron_h.attention.layer_norm_rms_epsilon" not in keys
    eps = keys["nemotron_h.attention.layer_norm_epsilon"][2]
    spelled = copy.deepcopy(s)
    _set(spelled, "nemotron_h.attention.layer_norm_rms_epsilon", "FLOAT32", eps)
    want = logits(write_model(spelled, tmp_path / "spelled.gguf"))
    assert torch.equal(logits(write_model(s, tmp_path / "converted.gguf")), want)
    _set(spelled, "nemotron_h.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-6)
    assert not torch.allclose(logits(write_model(spelled, tmp_path / "e6.gguf")), want)


def test_mistral3_yarn_log_multiplier(tmp_path: Path) -> None:
    """The converter writes Ministral 3's mscale_all_dim as ``rope.scaling.yarn_log_multiplier``
    (1.0); llama.cpp's mistral3 loader makes YaRN's magnitude get_mscale(f, 1) /
    get_mscale(f, 1.0) = 1 (we applied 1 + 0.1 ln f: 9.3e-3 relative off transformers, 2.7e-7
    now). The same file without the key, its magnitude set to 1 through
    ``rope.scaling.attn_factor`` (llama.cpp multiplies it in), gives the same logits."""
    s = spec("mistral3", stdev=0.5)  # scores large enough for their scale to show
    keys = {m[0]: m for m in s["metadata"]}
    assert keys["mistral3.rope.scaling.yarn_log_multiplier"][2] == 1.0
    factor = keys["mistral3.rope.scaling.factor"][2]
    ref = copy.deepcopy(s)
    ref["metadata"] = [m for m in ref["metadata"] if not m[0].endswith("yarn_log_multiplier")]
    _set(ref, "mistral3.rope.scaling.attn_factor", "FLOAT32", 1 / (1 + 0.1 * math.log(factor)))
    got = logits(write_model(s, tmp_path / "converted.gguf"))
    want = logits(write_model(ref, tmp_path / "ref.gguf"))
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    ref["metadata"] = [m for m in ref["metadata"] if not m[0].endswith("attn_factor")]
    unscaled = logits(write_model(ref, tmp_path / "unscaled.gguf"))
    assert (unscaled - want).abs().max() > 1e-3 * want.abs().max()
