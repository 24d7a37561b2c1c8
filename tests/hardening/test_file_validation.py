"""Crafted model and adapter files (issue 31, item 1): each is refused at load with one line
naming the problem, before any kernel sees a weight, and the kernels refuse sizes that do not
fit even when the loader is bypassed. The files are the tiny models of `tests.tiny` with one
thing changed (a hyper-parameter, a layer's width, a tensor's type or offset) and the demo
adapters' files with their ranks, alpha or patterns changed."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loraserve.lora.preflight import PreflightError, preflight
from loraserve.model.gguf import GGUFError, GGUFFile
from loraserve.model.gguf_write import write_gguf
from loraserve.model.loader import load_model
from loraserve.model.validate import ModelFileError
from tests.hardening.fuzz_gguf import fields
from tests.hardening.seed_files import ROOT, seed_models

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return seed_models(tmp_path_factory.mktemp("seeds"))


def _patched(src: Path, dst: Path, role: str, key: str, value: int) -> Path:
    """src with one header field (``role`` of metadata key / tensor ``key``) set to value."""
    data = bytearray(src.read_bytes())
    table, _ = fields(bytes(data))
    f = next(f for f in table if f.role == role and f.key == key)
    data[f.offset : f.offset + f.size] = value.to_bytes(f.size, "little")
    dst.write_bytes(bytes(data))
    return dst


def _rewritten(src: Path, dst: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """src with some tensors replaced (written as F32, the others in their own type)."""
    with GGUFFile(src) as gg:
        meta = dict(gg.metadata)
        out = {n: tensors.get(n, gg.tensor(n)) for n in gg.tensors} | tensors
        types = {n: i.ggml_type for n, i in gg.tensors.items() if n not in tensors}
    return write_gguf(dst, meta, out, types)


def test_head_count_changed_is_one_line_at_load_and_preflight(seeds: dict, tmp_path: Path) -> None:
    """The issue's crash: Gemma 3 with attention.head_count 4 -> 2 passed the header checks
    and aborted in the fused C layers; now the load names the first tensor that disagrees."""
    bad = _patched(seeds["gemma_q8"], tmp_path / "h2.gguf", "int", "gemma3.attention.head_count", 2)
    with pytest.raises(ModelFileError) as e:
        load_model(bad)
    msg = str(e.value)
    assert "\n" not in msg and str(bad) in msg
    assert "'blk.0.attn_q.weight' has shape (128, 64)" in msg and "2 heads" in msg
    with pytest.raises(PreflightError, match=r"blk\.0\.attn_q\.weight"):
        preflight(bad, [])


def test_the_fused_kernel_refuses_the_mismatch_without_the_loader(seeds: dict) -> None:
    """With the loader's checks bypassed (the config built from the metadata alone, as before),
    the C entry point compares its widths and the step fails with an error; no process dies.
    Run in a child: a regression would abort it, not the test run."""
    script = f"""
import sys
from dataclasses import replace
import loraserve.model.loader as L
from loraserve.model.config import ModelConfig
from loraserve.kernels.layers import FusedLayers
m = L.load_model({str(seeds["gemma_q8"])!r})
fused = m.decoder._fused()
assert fused is not None, "the fused C path is not in use"
fused._model.n_heads = 2  # the metadata's word, against the tensors'
import torch
x = torch.zeros(1, m.config.hidden_size)
try:
    fused(x, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
          torch.tensor([0, 1]), torch.zeros(1), torch.ones(1), 0,
          m.decoder.rope_global.tables(torch.zeros(1, dtype=torch.long)),
          m.decoder.rope_local.tables(torch.zeros(1, dtype=torch.long)),
          [(torch.zeros(4, m.config.n_kv_heads, m.config.head_dim),) * 2] * m.config.n_layers)
except ValueError as e:
    print("refused:", e)
"""
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "refused: fused layers: a projection, norm or adapter of another width" in p.stdout


def test_quantized_matmul_refuses_rows_shorter_than_the_activations() -> None:
    from loraserve import kernels

    if kernels.backend() != "c":
        pytest.skip("no C kernels here")
    raw = torch.zeros(8, 34, dtype=torch.uint8)  # 8 rows of one Q8_0 block: K = 32
    parts = kernels.QuantizedParts([(raw, 8, 0)])
    out = torch.zeros(2, 8)
    parts(torch.zeros(2, 32), out)  # fits
    with pytest.raises(ValueError, match="sizes do not fit"):
        parts(torch.zeros(2, 64), out)  # would read 2 blocks from rows of 1
    with pytest.raises(ValueError, match="sizes do not fit"):
        parts(torch.zeros(2, 32), torch.zeros(2, 4))  # 8 columns into rows of 4


def test_every_layer_ffn_width_is_checked(seeds: dict, tmp_path: Path) -> None:
    """Layer 1's feed-forward narrower than layer 0's (whose width the fused call took)."""
    g = torch.Generator().manual_seed(0)
    narrow = {"blk.1.ffn_gate.weight": torch.randn(64, 64, generator=g),
              "blk.1.ffn_up.weight": torch.randn(64, 64, generator=g),
              "blk.1.ffn_down.weight": torch.randn(64, 64, generator=g)}  # fmt: skip
    bad = _rewritten(seeds["llama"], tmp_path / "ffn.gguf", narrow)
    with pytest.raises(ModelFileError, match=r"'blk\.1\.ffn_gate\.weight' has shape \(64, 64\)"):
        load_model(bad)


@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        ("blk.1.attn_norm.weight", (32,), r"'blk\.1\.attn_norm\.weight' has shape \(32,\)"),
        ("output_norm.weight", (96,), r"output_norm\.weight has shape \(96,\)"),
        ("token_embd.weight", (300, 64), "token_embd.weight has 300 rows for a tokenizer of 320"),
        ("blk.2.attn_q.weight", (64, 64), r"'blk\.2\.attn_q\.weight' is past the last of 2"),
        ("blk.0.attn_q.bias", (32,), "one value per row of its weight"),
    ],
)
def test_norms_vocab_and_extra_tensors_are_checked(
    seeds: dict, tmp_path: Path, name: str, shape: tuple[int, ...], message: str
) -> None:
    bad = _rewritten(seeds["llama"], tmp_path / "b.gguf", {name: torch.ones(shape)})
    with pytest.raises(ModelFileError, match=message):
        load_model(bad)


def test_a_missing_layer_tensor_is_named(seeds: dict, tmp_path: Path) -> None:
    with GGUFFile(seeds["llama"]) as gg:
        meta = dict(gg.metadata)
        out = {n: gg.tensor(n) for n in gg.tensors if n != "blk.1.ffn_norm.weight"}
    bad = write_gguf(tmp_path / "m.gguf", meta, out)
    with pytest.raises(ModelFileError, match=r"lacks tensor 'blk\.1\.ffn_norm\.weight'"):
        load_model(bad)


def test_expert_count_against_the_expert_tensors(tmp_path: Path) -> None:
    from tests.tiny import hf_model
    from tests.tiny import write_gguf as write_tiny

    path = write_tiny(tmp_path / "moe.gguf", hf_model("mixtral"), "mixtral")
    load_model(path)  # the seed loads
    bad = _patched(path, tmp_path / "e.gguf", "int", "llama.expert_count", 8)
    with pytest.raises(ModelFileError, match=r"ffn_gate_inp\.weight' has shape \(4, 64\)"):
        load_model(bad)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("gemma3.attention.head_count", 0, "head_count = 0: must be an integer from 1"),
        ("gemma3.attention.head_count_kv", 3, "multiple of"),
        ("gemma3.attention.key_length", 31, "head dim 31 is odd"),
        ("gemma3.block_count", 5000, "block_count = 5000"),
        ("gemma3.embedding_length", 1 << 31, "embedding_length"),
    ],
)
def test_hyper_parameters_are_checked(
    seeds: dict, tmp_path: Path, key: str, value: int, message: str
) -> None:
    bad = _patched(seeds["gemma_q8"], tmp_path / "p.gguf", "int", key, value)
    with pytest.raises(ValueError, match=message) as e:  # ModelFileError, UnsupportedModelError
        load_model(bad)
    assert str(bad) in str(e.value) and type(e.value).__module__.startswith("loraserve.")


def test_a_flipped_type_or_aliased_offsets_are_refused(seeds: dict, tmp_path: Path) -> None:
    """Q8_0 -> Q4_0 (a smaller type: the tensor leaves a gap), and one tensor's offset set to
    another's (they alias): both loaded 'fine' with garbage before."""
    src = seeds["gemma_q8"]
    flipped = _patched(src, tmp_path / "t.gguf", "ttype", "blk.0.attn_q.weight", 2)
    with pytest.raises(GGUFError, match="leaves a gap"):
        GGUFFile(flipped)
    table, _ = fields(src.read_bytes())
    offs = {f.key: f for f in table if f.role == "toffset"}
    other = int.from_bytes(src.read_bytes()[offs["blk.0.attn_k.weight"].offset :][:8], "little")
    alias = _patched(src, tmp_path / "o.gguf", "toffset", "blk.0.attn_v.weight", other)
    with pytest.raises(GGUFError, match="overlaps the tensor before it"):
        GGUFFile(alias)


def test_nested_arrays_cannot_amplify(tmp_path: Path) -> None:
    """100,000 empty arrays inside an array: 1.2 MB of file, refused before it costs memory."""
    n = 100_000
    value = struct.pack("<IQ", 9, n) + struct.pack("<IQ", 4, 0) * n  # ARRAY of n empty arrays
    key = b"x.nested"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    path = tmp_path / "n.gguf"
    path.write_bytes(head + struct.pack("<I", 9) + value)
    with pytest.raises(GGUFError, match="more than 65536 arrays inside arrays"):
        GGUFFile(path)
