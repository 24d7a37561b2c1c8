"""Fixtures shared by the LoRA tests: a tiny Gemma 3, a `--lora-dir` of PEFT adapters on it
and an aLoRA (PEFT's, with its GGUF form)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loraserve.model.loader import LoadedModel, load_model
from tests.tiny import hf_model, write_gguf
from tests.unit.lora.alora_util import INV, gguf_alora
from tests.unit.lora.lora_util import gguf_from_peft, peft_adapter


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[LoadedModel, torch.nn.Module]:
    """A 2-layer transformers Gemma 3 (seed 3) and its GGUF loaded: (model, m)."""
    m = hf_model("gemma3", num_hidden_layers=2, seed=3)
    return load_model(write_gguf(tmp_path_factory.mktemp("m") / "g.gguf", m, "gemma3")), m


@pytest.fixture(scope="module")
def lib(tiny, tmp_path_factory) -> tuple[Path, dict[str, torch.nn.Module]]:
    """A --lora-dir with PEFT folders a, b, c, d (seeds 1-4) and e.gguf (a's GGUF form)."""
    _, m = tiny
    root = tmp_path_factory.mktemp("loras")
    peft = {}
    for seed, n in enumerate("abcd", 1):
        _, peft[n] = peft_adapter(root / n, m, seed=seed)
    gguf_from_peft(root / "e.gguf", root / "a", m, "gemma3")
    return root, peft


@pytest.fixture(scope="module")
def alora(tiny, tmp_path_factory) -> tuple[Path, Path, torch.nn.Module]:
    """PEFT's aLoRA (folder, its GGUF form, the PEFT model)."""
    _, m = tiny
    root = tmp_path_factory.mktemp("alora")
    _, pm = peft_adapter(
        root / "inv", m, seed=1, alora_invocation_tokens=INV, task_type="CAUSAL_LM"
    )
    assert (
        json.loads((root / "inv" / "adapter_config.json").read_text())["alora_invocation_tokens"]
        == INV
    )
    return root / "inv", gguf_alora(root / "inv.gguf", root / "inv"), pm
