"""Crafted adapter files (issue 31, items 1 and 9): refused before dequantizing, with one line
naming the problem, and 400s at run time."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loraserve.lora.adapter import AdapterError, load_adapter
from loraserve.model.gguf import GGUFFile
from loraserve.model.gguf_write import write_gguf
from tests.hardening.fuzz_worker import GEMMA_270M
from tests.hardening.seed_files import ADAPTERS, base_shapes

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# ---- adapters ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_base() -> tuple[Any, dict[str, tuple[int, ...]]]:
    from loraserve.model.config import ModelConfig

    shapes = {k: tuple(v) for k, v in base_shapes(ADAPTERS / "titlecase").items()}
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
