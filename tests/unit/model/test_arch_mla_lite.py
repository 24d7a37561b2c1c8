"""deepseek2 in DeepSeek-V2-Lite's layout: the query projected by one ``attn_q`` (no
``q_lora_rank``, no ``attn_q_a``/``attn_q_b``), as llama.cpp's deepseek2 graph reads it. Such a
file was refused at load (its query rows were checked against the cache row, 576 a head, instead
of the query head, no-rope plus rope dims, 192). Built from the recorded tiny deepseek2 spec
with the query tensors replaced: it loads, and its greedy answers are the same alone and batched
through the engine."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.engine.sampling.params import SamplingParams
from loraserve.model.loader import load_model
from tests.arch_models import write_model
from tests.engine_util import ask, run_and_drain

SPEC = Path(__file__).resolve().parents[2] / "data" / "archs" / "deepseek2.json"


def _lite_spec() -> dict:
    spec = json.loads(SPEC.read_text())["variants"]["moe"]
    meta = {k: v for k, _, v in spec["metadata"]}
    n_heads = int(meta["deepseek2.attention.head_count"])
    q_width = int(meta["deepseek2.attention.key_length_mla"])  # no-rope + rope dims
    hidden = int(meta["deepseek2.embedding_length"])
    tensors = []
    for name, shape, t in spec["tensors"]:
        if ".attn_q_a" in name:
            continue
        if name.endswith(".attn_q_b.weight"):
            name, shape = name.replace("attn_q_b", "attn_q"), [n_heads * q_width, hidden]
        tensors.append([name, shape, t])
    metadata = [
        [k, vt, 0 if k == "deepseek2.attention.q_lora_rank" else v] for k, vt, v in spec["metadata"]
    ]
    return {**spec, "tensors": tensors, "metadata": metadata}


def test_v2_lite_query_layout_loads_and_runs(tmp_path: Path) -> None:
    spec = _lite_spec()
    assert any(n.endswith(".attn_q.weight") for n, _, _ in spec["tensors"])
    model = load_model(write_model(spec, tmp_path / "deepseek2-lite.gguf"))
    prompts = [[5, 9, 17, 33, 2, 71], [99, 46, 66, 78], [12, 13, 14]]
    greedy = SamplingParams(temperature=0.0, n_probs=2)
    eng = Engine(model, EngineConfig(n_slots=4, n_ctx=4 * 64, block_size=4))
    evs = run_and_drain(eng, [ask(p, 1, sampling=greedy) for p in prompts])
    batched = [e[0].probs for e in evs]
    alone = Engine(model, EngineConfig(n_slots=1, n_ctx=64, block_size=4))
    for p, want in zip(prompts, batched, strict=True):
        got = run_and_drain(alone, [ask(p, 1, sampling=greedy, cache_prompt=False)])[0][0].probs
        assert got == want
    assert all(torch.isfinite(torch.tensor([lp for _, lp in b])).all() for b in batched)
