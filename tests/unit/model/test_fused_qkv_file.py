"""phi3 files with q|k|v in one ``attn_qkv`` tensor, as llama.cpp's converter writes every
Phi-3 / Phi-3.5 model (convert_hf_to_gguf keeps ``qkv_proj`` whole) and llama.cpp's loader
takes first (``create_tensor_qkv``): the recorded phi3 model (q, k and v apart, its answers
checked against llama-server in test_archs) rewritten with the three stacked into one tensor
(and their biases into ``attn_qkv.bias``) gives bit-identical logits. Before, validation asked
for ``attn_q`` and refused every converted Phi-3 file ("the model lacks tensor
'blk.0.attn_q.weight'")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from loraserve.engine.runner import ModelRunner
from loraserve.model.gguf_write import write_gguf
from loraserve.model.validate_common import ModelFileError
from tests.arch_models import tensor_values, typed_metadata
from tests.unit.model.archs_util import RECORDS, forced_logits, load, model_file

ARCH, VARIANT = "phi3", "dense"
QKV = ("attn_q", "attn_k", "attn_v")


def _fused_file(tmp: Path, qtype: str, rows_off: int = 0) -> Path:
    """The recorded phi3 model with each layer's q, k, v (and biases) stacked into attn_qkv;
    `rows_off` drops that many rows of every attn_qkv (a file that does not fit)."""
    rec = RECORDS[ARCH]["variants"][VARIANT]
    values = tensor_values(rec)
    types = {name: t for name, _, t in rec["tensors"]}
    if qtype != "F32":
        types.update({k: int(t) for k, t in rec["files"][qtype]["types"].items()})
    out: dict[str, np.ndarray] = {}
    out_types: dict[str, int] = {}
    for name, arr in values.items():
        parts = name.split(".")
        if name.startswith("blk.") and parts[2] in QKV:
            if parts[2] != "attn_q":
                continue
            stem, kind = f"blk.{parts[1]}.attn_qkv", parts[3]
            full = np.concatenate([values[f"blk.{parts[1]}.{s}.{kind}"] for s in QKV])
            out[f"{stem}.{kind}"] = full[: len(full) - rows_off]
            q_types = {types[f"blk.{parts[1]}.{s}.{kind}"] for s in QKV}
            assert len(q_types) == 1, "q, k and v of one type"
            out_types[f"{stem}.{kind}"] = q_types.pop()
        else:
            out[name], out_types[name] = arr, types[name]
    path = tmp / f"{ARCH}-fused-qkv-{qtype}-{rows_off}.gguf"
    return write_gguf(path, typed_metadata(rec["metadata"]), out, out_types)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_fused_qkv_file_equals_separate(tmp_path: Path, qtype: str) -> None:
    cases = RECORDS[ARCH]["variants"][VARIANT]["answers"][qtype]
    apart = load(model_file(tmp_path, ARCH, VARIANT, qtype), ARCH)
    fused = load(_fused_file(tmp_path, qtype), ARCH)
    assert fused.decoder.blocks[0].qkv.name == "blk.0.attn_qkv.weight"
    want = forced_logits(ModelRunner(apart.decoder, 16, torch.float16), cases)
    got = forced_logits(ModelRunner(fused.decoder, 16, torch.float16), cases)
    assert torch.equal(got, want)


def test_fused_qkv_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="attn_qkv"):
        load(_fused_file(tmp_path, "F32", rows_off=32), ARCH)
