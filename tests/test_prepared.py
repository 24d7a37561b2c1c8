"""The prepared int8 weights cache: used for big models only, one file per model file."""

from __future__ import annotations

import os

import torch

from loraserve.model import prepared
from loraserve.model.loader import load_model
from tests.tiny import hf_model, our_logits, write_gguf


def test_cache_written_reused_and_replaced(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LORASERVE_MODEL_CACHE", str(tmp_path / "cache"))
    path = write_gguf(
        tmp_path / "m.gguf", hf_model("gemma3", num_hidden_layers=2, seed=1), "gemma3"
    )
    assert prepared.prepared_cache_file(path) is None  # tiny: requantized at each load
    monkeypatch.setattr(prepared, "MIN_MODEL_BYTES", 0)
    first = load_model(path, int8=True)
    files = list((tmp_path / "cache" / "prepared").glob("*.safetensors"))
    assert files == [prepared.prepared_cache_file(path)]
    again = load_model(path, int8=True)  # reads the file: the same int8 weights
    assert torch.equal(again.decoder.blocks[1].qkv.w8, first.decoder.blocks[1].qkv.w8)
    ids = [1, 5, 9, 13, 2]
    assert torch.equal(our_logits(again, ids, chunk=2), our_logits(first, ids, chunk=2))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the model file changed
    load_model(path, int8=True)
    files = list((tmp_path / "cache" / "prepared").glob("*.safetensors"))
    assert files == [prepared.prepared_cache_file(path)]  # the old one is gone
