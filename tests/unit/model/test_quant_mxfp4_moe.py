"""A tiny random gpt-oss MoE in MXFP4 against llama-server (scripts/record_mxfp4_moe.py).

The record holds the spec of `test-llama-archs`' gpt-oss MoE template with our seed, the tensor
digest of what ``llama-quantize ... MXFP4_MOE`` made of it (experts MXFP4, other matrices Q8_0)
and llama-server's greedy tokens with top-2 log-probabilities on the F32 and MXFP4 files. Here
the MXFP4 file is rebuilt by loraserve's quantizer (its bytes checked against llama-quantize's)
and, teacher-forced on llama-server's tokens with its default fp16 KV cache, loraserve picks
llama-server's token wherever its top-1/top-2 gap is >= 0.5; the same prefixes through the
engine, batched and alone, give bit-identical answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.engine.sampling.params import SamplingParams
from loraserve.model.loader import load_model
from tests.arch_models import tensor_digest, write_model
from tests.engine_util import ask, run_and_drain

REC = json.loads((Path(__file__).resolve().parents[2] / "data/mxfp4_moe.json").read_text())
SPEC = REC["variants"]["moe"]
QTYPE = "MXFP4_MOE"
KV = torch.float16  # llama-server's default KV cache type, as recorded
MXFP4, Q8_0 = 39, 8


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    files = SPEC["files"][QTYPE]
    types = {k: int(t) for k, t in files["types"].items()}
    assert {t for n, t in types.items() if "_exps.weight" in n} == {MXFP4}
    path = write_model(SPEC, tmp_path_factory.mktemp("mxfp4") / "gpt-oss-mxfp4.gguf", types)
    assert tensor_digest(path)[0] == files["tensors_sha256"], "not llama-quantize's bytes"
    return path


def forced_logits(runner: ModelRunner, cases: list[dict[str, Any]]) -> torch.Tensor:
    """Each case's prompt and llama-server's tokens in one forward pass: the logits [sum N, V]
    of every position that predicts one of the N tokens."""
    items, block = [], 0
    for c in cases:
        seq = c["prompt"] + c["tokens"][:-1]
        n_blocks = -(-len(seq) // runner.bs)
        items.append(
            BatchItem(seq, 0, len(seq), list(range(block, block + n_blocks)), True, {},
                      n_logits=len(c["tokens"]))
        )  # fmt: skip
        block += n_blocks
    runner.ensure_capacity(block)
    return runner.forward(items)


def test_mxfp4_moe_greedy_equals_llama_server(model_path: Path) -> None:
    model = load_model(model_path)
    cases = SPEC["answers"][QTYPE]
    ours = forced_logits(ModelRunner(model.decoder, 16, KV), cases).argmax(-1).tolist()
    ref = [(t, top2[0][1] - top2[1][1]) for c in cases
           for t, top2 in zip(c["tokens"], c["top2"], strict=True)]  # fmt: skip
    decided = [(k, t, o) for k, ((t, gap), o) in enumerate(zip(ref, ours, strict=True))
               if gap >= 0.5]  # fmt: skip
    assert len(decided) >= len(ref) // 2, "too few decided positions to mean anything"
    wrong = [d for d in decided if d[1] != d[2]]
    assert not wrong, f"{len(wrong)}/{len(decided)} decided positions differ: {wrong}"


def test_mxfp4_moe_answers_are_the_same_batched_and_alone(model_path: Path) -> None:
    model = load_model(model_path)
    cases = SPEC["answers"][QTYPE]
    prefixes = [c["prompt"] + c["tokens"][:i] for c in cases for i in (0, 11, 23)]
    probs = SamplingParams(temperature=0.0, n_probs=2)

    def answers(eng: Engine, ps: list[list[int]], **kw: Any) -> list[tuple[int, Any]]:
        evs = run_and_drain(eng, [ask(p, 1, sampling=probs, **kw) for p in ps])
        assert all(e[-1].error is None for e in evs)
        return [(e[0].token, e[0].probs) for e in evs]

    batched = answers(Engine(model, EngineConfig(n_slots=16, n_ctx=16 * 256, block_size=4,
                                                 kv_dtype=KV)), prefixes)  # fmt: skip
    alone = Engine(model, EngineConfig(n_slots=1, n_ctx=256, block_size=4, kv_dtype=KV))
    assert [answers(alone, [p], cache_prompt=False)[0] for p in prefixes] == batched
