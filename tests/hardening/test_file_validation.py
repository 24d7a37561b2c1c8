"""Crafted model and adapter files (issue 31, item 1): each is refused at load with one line
naming the problem, before any kernel sees a weight, and the kernels refuse sizes that do not
fit even when the loader is bypassed. The files are the tiny models of `tests.tiny` with one
thing changed (a hyper-parameter, a layer's width, a tensor's type or offset) and the demo
adapters' files with their ranks, alpha or patterns changed."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loraserve.lora.adapter import AdapterError, load_adapter
from loraserve.lora.preflight import PreflightError, preflight
from loraserve.model.gguf import GGUFError, GGUFFile
from loraserve.model.gguf_write import write_gguf
from loraserve.model.loader import load_model
from loraserve.model.validate import ModelFileError
from tests.hardening.fuzz_gguf import fields
from tests.hardening.fuzz_worker import GEMMA_270M
from tests.hardening.test_fuzz_files import ADAPTERS, ROOT, _base_shapes, _seed_models

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _seed_models(tmp_path_factory.mktemp("seeds"))


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


# ---- adapters ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_base() -> tuple[Any, dict[str, tuple[int, ...]]]:
    from loraserve.model.config import ModelConfig

    shapes = {k: tuple(v) for k, v in _base_shapes(ADAPTERS / "titlecase").items()}
    return ModelConfig(**GEMMA_270M), shapes


def test_gguf_lora_rank_mismatch_refused_before_dequantizing(
    gemma_base: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, shapes = gemma_base
    src = ADAPTERS / "titlecase.gguf"
    with GGUFFile(src) as gg:
        meta = dict(gg.metadata)
        out = {n: gg.tensor(n) for n in gg.tensors}
    name = next(n for n in out if n.endswith("attn_q.weight.lora_a"))
    out[name] = out[name][:-1]  # A of rank r - 1, B of rank r
    bad = write_gguf(tmp_path / "r.gguf", meta, out)
    read = []
    monkeypatch.setattr(GGUFFile, "tensor", lambda self, n, *a: read.append(n))
    with pytest.raises(AdapterError, match=r"has rank \d+ in A .* but \d+ in B"):
        load_adapter(bad, cfg, shapes)
    assert read == []  # nothing was dequantized
    monkeypatch.undo()
    from loraserve.lora.preflight import check_adapter  # the start-up check, headers only

    with pytest.raises(AdapterError, match="rank"):
        check_adapter(bad, cfg, shapes)


def _peft(tmp_path: Path, **conf: Any) -> Path:
    folder = tmp_path / "peft"
    shutil.copytree(ADAPTERS / "titlecase", folder)
    c = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**c, **conf}))
    return folder


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"rank_pattern": {"(a+)+$": 4}}, "a repeat inside a repeat"),
        ({"rank_pattern": {"(a|a)*b": 4}}, "an alternation under a repeat"),
        ({"alpha_pattern": {"(?P<n>a)(?P=n)": 4}}, "a backreference"),
        ({"rank_pattern": {"(": 4}}, "does not compile"),
        ({"rank_pattern": [1, 2]}, "rank_pattern must be an object"),
        ({"r": 0}, r"r = 0 \(an integer from 1"),
        ({"r": "8"}, "r = '8'"),
        ({"lora_alpha": float("inf")}, "LoRA alpha inf"),
        ({"rank_pattern": {"q_proj": 0}}, "is not a rank"),
    ],
)
def test_peft_configs_are_bounded(
    gemma_base: Any, tmp_path: Path, conf: dict[str, Any], message: str
) -> None:
    cfg, shapes = gemma_base
    folder = _peft(tmp_path, **conf)
    t0 = time.perf_counter()
    with pytest.raises(AdapterError, match=message):
        load_adapter(folder, cfg, shapes)
    assert time.perf_counter() - t0 < 10  # refused, not matched for minutes


def test_deep_json_is_an_adapter_error(gemma_base: Any, tmp_path: Path) -> None:
    cfg, shapes = gemma_base
    folder = _peft(tmp_path)
    (folder / "adapter_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(AdapterError, match="nested"):
        load_adapter(folder, cfg, shapes)


def test_bounded_patterns_still_work(gemma_base: Any, tmp_path: Path) -> None:
    """A PEFT rank pattern of the ordinary kind (a module name, `.*`) keeps PEFT's meaning."""
    cfg, shapes = gemma_base
    c = json.loads((ADAPTERS / "titlecase" / "adapter_config.json").read_text())
    r = c["r"]
    ok = load_adapter(_peft(tmp_path, alpha_pattern={".*q_proj": 4 * r}), cfg, shapes)
    q = next(w for t, w in ok.weights.items() if t.endswith("attn_q.weight"))
    v = next(w for t, w in ok.weights.items() if t.endswith("attn_v.weight"))
    assert np.isclose(q.factor, 4 * r / r) and np.isclose(v.factor, c["lora_alpha"] / r)


def test_hostile_adapters_at_run_time_are_400s(tmp_path: Path) -> None:
    """Over HTTP on the tiny llama: a PEFT folder whose rank pattern backtracks, one with JSON
    nested 100,000 deep, one with r = 0, and a GGUF LoRA whose ranks disagree are each a 400
    naming the problem (none a 500, none a hang), and the server keeps answering."""
    from tests.server_util import peft_folder, serve_in_thread

    lora_dir = tmp_path / "loras"
    lora_dir.mkdir()
    evil = peft_folder(lora_dir / "evil", seed=1)
    conf = json.loads((evil / "adapter_config.json").read_text())
    (evil / "adapter_config.json").write_text(json.dumps({**conf, "rank_pattern": {"(a+)+$": 2}}))
    deep = peft_folder(lora_dir / "deep", seed=2)
    (deep / "adapter_config.json").write_text("[" * 100_000 + "]" * 100_000)
    zero = peft_folder(lora_dir / "zero", seed=3)
    (zero / "adapter_config.json").write_text(json.dumps({**conf, "r": 0}))
    g = torch.Generator().manual_seed(0)
    write_gguf(
        lora_dir / "ranks.gguf",
        {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora",
         "adapter.lora.alpha": 8.0},
        {"blk.0.attn_q.weight.lora_a": torch.randn(4, 64, generator=g),
         "blk.0.attn_q.weight.lora_b": torch.randn(64, 3, generator=g)},
    )  # fmt: skip
    expected = {"evil": "a repeat inside a repeat", "deep": "nested 100000 deep",
                "zero": "r = 0", "ranks.gguf": "rank 4 in A"}  # fmt: skip
    with serve_in_thread(["-c", "256", "-n", "4", "--lora-dir", str(lora_dir)]) as srv:
        for name, message in expected.items():
            r = srv.client.post("/lora-adapters/load", json={"path": name})
            assert r.status_code == 400, (name, r.status_code, r.text)
            assert message in r.json()["error"]["message"], (name, r.text)
        assert srv.client.get("/health").status_code == 200
        ok = srv.client.post("/completion", json={"prompt": "the", "n_predict": 2})
        assert ok.status_code == 200
