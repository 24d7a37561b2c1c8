"""Crafted falcon-h1 / nemotron_h / jamba files are refused whole at load, with one line naming
the problem, before any layer reads a weight (`recurrent.tensors`, `validate`): wrong shapes of
tensors with and without a ``.weight`` suffix, missing tensors, SSM sizes that do not divide,
per-layer counts of the wrong length, and nemotron_h_moe's expert tensors that do not fit."""

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
from loraserve.model.validate import ModelFileError
from tests.arch_models import write_model

DATA = Path(__file__).resolve().parents[2] / "data" / "archs"


def spec(arch: str) -> dict[str, Any]:
    return copy.deepcopy(json.loads((DATA / f"{arch}.json").read_text())["variants"]["dense"])


def reshape(s: dict[str, Any], name: str, shape: list[int] | None) -> dict[str, Any]:
    """The spec with tensor ``name`` given ``shape`` (None: left out)."""
    t = [x for x in s["tensors"] if x[0] != name]
    if shape is not None:
        t.append([name, shape, 0])
    assert len(t) != len(s["tensors"]) or shape is not None
    s["tensors"] = t
    return s


def meta(s: dict[str, Any], key: str, vtype: str, value: Any) -> dict[str, Any]:
    s["metadata"] = [m for m in s["metadata"] if m[0] != key] + [[key, vtype, value]]
    return s


CASES = [
    ("jamba", lambda s: reshape(s, "blk.1.ssm_a", [512, 64]), r"blk\.1\.ssm_a.*\(512, 128\)"),
    ("jamba", lambda s: reshape(s, "blk.1.ssm_d", [256]), r"blk\.1\.ssm_d"),
    ("jamba", lambda s: reshape(s, "blk.1.ssm_x.weight", [200, 512]), r"ssm_x"),
    ("jamba", lambda s: reshape(s, "blk.1.ssm_dt.weight", None), r"lacks.*blk\.1\.ssm_dt\.weight"),
    ("jamba", lambda s: reshape(s, "blk.1.ssm_b_norm.weight", None), r"ssm_b_norm"),
    ("jamba", lambda s: reshape(s, "blk.1.ssm_in.weight", [1538, 256]), r"ssm_in"),
    ("falcon-h1", lambda s: reshape(s, "blk.0.ssm_a", [3, 1]), r"blk\.0\.ssm_a"),
    ("falcon-h1", lambda s: reshape(s, "blk.1.ffn_norm", [255]), r"blk\.1\.ffn_norm"),
    ("falcon-h1", lambda s: reshape(s, "blk.1.ffn_norm", None), r"lacks.*blk\.1\.ffn_norm"),
    ("falcon-h1", lambda s: reshape(s, "blk.0.ssm_dt.bias", None), r"ssm_dt\.bias"),
    ("falcon-h1", lambda s: meta(s, "falcon-h1.ssm.group_count", "UINT32", 3), r"divide|shape"),
    ("falcon-h1", lambda s: meta(s, "falcon-h1.ssm.state_size", "UINT32", 0), r"SSM sizes|ssm_in"),
    ("nemotron_h", lambda s: reshape(s, "blk.1.ssm_conv1d.bias", [7]), r"ssm_conv1d\.bias"),
    ("nemotron_h", lambda s: reshape(s, "blk.2.ffn_up.weight", [384, 255]), r"ffn_up"),
    (
        "nemotron_h",
        lambda s: meta(s, "nemotron_h.feed_forward_length", "ARRAY:UINT32", [0, 384]),
        r"3 entries|per-layer",
    ),  # fmt: skip
]


@pytest.mark.parametrize("arch,craft,message", CASES, ids=[f"{a}-{m}" for a, _, m in CASES])
def test_crafted_file_refused_clearly(tmp_path: Path, arch: str, craft: Any, message: str) -> None:
    path = write_model(craft(spec(arch)), tmp_path / "crafted.gguf")
    with pytest.raises((ModelFileError, UnsupportedModelError), match=message):
        load_model(path)


def moe_spec(record: str = "nemotron_h_moe") -> dict[str, Any]:
    """nemotron_h_moe's recorded variant with routed experts (scripts/record_hybrid_experts.py)."""
    return copy.deepcopy(json.loads((DATA / f"{record}.json").read_text())["variants"]["moe"])


@pytest.mark.parametrize(
    "tag,craft,message",
    [
        ("", lambda s: reshape(s, "blk.2.ffn_up_exps.weight", [4, 256, 128]), "ffn_up_exps"),
        ("", lambda s: reshape(s, "blk.2.ffn_down_exps.weight", None), "ffn_down_exps"),
        ("+latent", lambda s: reshape(s, "blk.2.ffn_latent_up.weight", None), "ffn_latent_up"),
        (
            "+latent",
            lambda s: meta(s, "nemotron_h_moe.moe_latent_size", "UINT32", 64),
            "ffn_up_exps",
        ),
    ],
    ids=["expert-width", "missing-down", "missing-latent-up", "latent-width"],
)
def test_crafted_expert_file_refused_clearly(
    tmp_path: Path, tag: str, craft: Any, message: str
) -> None:
    path = write_model(craft(moe_spec("nemotron_h_moe" + tag)), tmp_path / "moe.gguf")
    with pytest.raises((ModelFileError, UnsupportedModelError), match=message):
        load_model(path)


def test_untouched_files_load(tmp_path: Path) -> None:
    """The crafted cases above start from files that load (each refusal is the craft's)."""
    for arch in ("jamba", "falcon-h1", "nemotron_h", "nemotron_h_moe"):
        m = load_model(write_model(spec(arch), tmp_path / f"{arch}.gguf"))
        assert m.config.arch == arch


def test_one_group_norm_stored_flat(tmp_path: Path) -> None:
    """A one-group Mamba-2 norm [1, d_inner] is stored [d_inner] by llama-quantize (ggml drops
    outer sizes of 1; every Granite 4 file): it loads, and runs as the [1, d_inner] one."""
    s = meta(spec("granitehybrid"), "granitehybrid.ssm.group_count", "UINT32", 1)
    for name, shape in [("ssm_in.weight", [1282, 256]), ("ssm_conv1d.weight", [768, 4]),
                        ("ssm_conv1d.bias", [768]), ("ssm_norm.weight", [1, 512])]:  # fmt: skip
        s = reshape(s, f"blk.1.{name}", shape)
    flat = reshape(copy.deepcopy(s), "blk.1.ssm_norm.weight", [512])
    logits = []
    for i, sp in enumerate((s, flat)):
        runner = ModelRunner(
            load_model(write_model(sp, tmp_path / f"g{i}.gguf")).decoder, 4, torch.float32
        )
        runner.ensure_capacity(2)
        logits.append(runner.forward([BatchItem([5, 9, 77, 3, 12], 0, 5, [0, 1], True, {})]))
    assert torch.equal(logits[0], logits[1])
