"""Gemma 3 270M, default (file-native) engine: requests under different adapter mixes, run
concurrently with the prefix cache on, give tokens and n_probs probabilities identical to
each one run alone with ``cache_prompt: false`` (the batch-invariant kernels' promise)."""

from __future__ import annotations

import pytest

from loraserve.adapters import gguf_path, peft_dir
from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from loraserve.model.loader import load_model
from tests.engine_util import ask, run_and_drain

pytestmark = pytest.mark.real_model
SHARED = "Question: What is the best thing about a rainy afternoon at home?\nAnswer:"
JOBS = [
    (SHARED, {}),
    (SHARED, {0: 1.0}),
    (SHARED + " Well,", {1: 1.0}),
    ("Dear diary, today I", {0: 0.5, 1: 0.5}),
    ("The three primary colors are", {0: -0.3}),
    (SHARED, {1: 0.8}),
]


def run(eng: Engine, jobs: list[tuple[str, dict[int, float]]], cache: bool) -> list[list]:
    """Submit every job at once, then step the engine until all finish; per job the
    (token, top-5 probabilities) of each generated position."""
    sp = SamplingParams(temperature=0.0, n_probs=5)
    tok = eng.tokenizer
    asks = [ask(tok.encode(p), 16, mix, sampling=sp, cache_prompt=cache) for p, mix in jobs]
    return [
        [(e.token, e.probs) for e in evs if e.token is not None] for evs in run_and_drain(eng, asks)
    ]


def test_concurrent_mixes_equal_each_alone_cache_off(real_model_path) -> None:
    model = load_model(real_model_path)

    def engine(n_slots: int) -> Engine:
        eng = Engine(model, EngineConfig(n_slots=n_slots, n_ctx=4096))
        eng.load_adapter(gguf_path("uppercase"), scale=0.0).result()
        eng.load_adapter(peft_dir("titlecase"), scale=0.0).result()
        return eng

    together_eng = engine(len(JOBS))
    run(together_eng, [(SHARED, {}), (SHARED, {0: 1.0})], cache=True)  # warm the cache
    together = run(together_eng, JOBS, cache=True)
    alone_eng = engine(1)
    for job, got in zip(JOBS, together, strict=True):
        (want,) = run(alone_eng, [job], cache=False)
        assert len(got) == 16 and got == want, f"{job[1]}: differs from its run alone"
    assert together[0] != together[1]  # the mixes matter
