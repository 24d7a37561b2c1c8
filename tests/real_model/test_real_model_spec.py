"""Gemma 3 270M, default (file-native) engine: speculative decoding on bench.spec's
copy-heavy prompts, under the demo adapters' mixes, concurrent: the tokens and n_probs
probabilities are those of speculation off, and most drafts are accepted (the model copies)."""

from __future__ import annotations

import pytest

from bench.spec import copy_prompts
from loraserve.adapters import gguf_path, peft_dir
from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecConfig
from loraserve.model.loader import load_model
from tests.engine_util import ask, run_and_drain

pytestmark = pytest.mark.real_model
SPEC = SpecConfig(
    types=("ngram-simple", "ngram-mod"),
    ngram_simple_size_n=4,
    ngram_simple_size_m=24,
    ngram_mod_n_match=8,
    ngram_mod_n_min=2,
    ngram_mod_n_max=24,
)
MIXES = [{}, {0: 1.0}, {1: 0.8}]


def test_speculation_keeps_every_token_and_probability(real_model_path) -> None:
    model = load_model(real_model_path)
    sampling = SamplingParams(temperature=0.0, n_probs=3)

    def run(spec: SpecConfig) -> tuple[list[list], int, int]:
        eng = Engine(model, EngineConfig(n_slots=3, n_ctx=3 * 2048, spec=spec))
        eng.load_adapter(gguf_path("uppercase"), scale=0.0).result()
        eng.load_adapter(peft_dir("titlecase"), scale=0.0).result()
        prompts = [model.tokenizer.encode(p) for p in copy_prompts()[:3]]
        asks = [ask(p, 48, MIXES[i], sampling=sampling) for i, p in enumerate(prompts)]
        evs = run_and_drain(eng, asks)
        t = [e[-1].timings for e in evs]
        out = [[(x.token, x.probs) for x in e if x.token is not None] for e in evs]
        return out, sum(x.draft_n for x in t), sum(x.draft_n_accepted for x in t)

    off, _, _ = run(SpecConfig())
    on, drafted, accepted = run(SPEC)
    assert on == off
    assert accepted > drafted / 2, (drafted, accepted)
