"""Qwen3.5 files with multi-token-prediction blocks (``nextn_predict_layers``) are served as
llama-server serves them: the blocks after the last layer are loaded for its MTP draft only
and never run in the main pass, so the answers are those of the trunk. Oracle: llama-server's
greedy tokens recorded on the very file (scripts/record_hybrid_mtp.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loraserve.engine.runner import ModelRunner
from loraserve.model.loader import load_model
from loraserve.model.validate import ModelFileError
from tests.arch_models import file_sha256, write_model
from tests.mtp_models import DATA, mtp_spec
from tests.unit.model.archs_util import GAP, KV, forced_logits

REC = json.loads((DATA / "mtp" / "qwen35.json").read_text())


def test_mtp_block_skipped_as_llama_server(tmp_path: Path) -> None:
    path = write_model(mtp_spec(), tmp_path / "mtp.gguf")
    assert file_sha256(path) == REC["sha256"], "not the file llama-server answered on"
    model = load_model(path)
    assert model.decoder.cfg.n_layers == 2
    cases = REC["answers"]["F32"]
    ours = forced_logits(ModelRunner(model.decoder, 16, KV), cases).argmax(-1)
    ref = [
        (t, p[0][1] - p[1][1]) for c in cases for t, p in zip(c["tokens"], c["top2"], strict=True)
    ]
    decided = [(t, int(o)) for (t, gap), o in zip(ref, ours, strict=True) if gap >= GAP]
    assert len(decided) >= len(ref) // 3
    assert [t for t, _ in decided] == [o for _, o in decided]
    # the trunk alone (the recorded 2-layer file) gives the very same logits, bit for bit
    base = json.loads((DATA / "qwen35.json").read_text())["variants"]["dense"]
    plain = load_model(write_model(base, tmp_path / "plain.gguf"))
    a = forced_logits(ModelRunner(model.decoder, 16, KV), cases)
    b = forced_logits(ModelRunner(plain.decoder, 16, KV), cases)
    assert torch.equal(a, b)


def test_mtp_block_still_checked(tmp_path: Path) -> None:
    """Blocks past block_count are still refused; an MTP-only file (a draft) lacks its trunk."""
    spec = mtp_spec()
    spec["tensors"].append(["blk.3.attn_norm.weight", [256], 0])
    with pytest.raises(ModelFileError, match=r"blk\.3\.attn_norm.*past the last"):
        load_model(write_model(spec, tmp_path / "extra.gguf"))
    spec = mtp_spec()
    spec["tensors"] = [t for t in spec["tensors"] if not t[0].startswith("blk.0.")]
    with pytest.raises(ModelFileError, match=r"lacks.*blk\.0\."):
        load_model(write_model(spec, tmp_path / "draft.gguf"))
