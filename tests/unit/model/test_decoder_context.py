"""Engines over one loaded model with different per-slot contexts (router presets sharing a
model with different ``-c``) each keep their own rope choice: phi3's long factors apply to
the engine whose context is past the trained one (``rope.scaling.original_context_length``),
never to another engine built earlier or later (`Decoder.for_context`)."""

from __future__ import annotations

import json
from pathlib import Path

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.engine.sampling.params import SamplingParams
from loraserve.model.loader import load_model
from tests.arch_models import write_model
from tests.engine_util import ask, run_and_drain

REC = json.loads(
    (Path(__file__).resolve().parents[2] / "data/archs/phi3+longrope.json").read_text()
)["variants"]["dense"]  # trained context 128, long factors past it (as llama-server's -c 256)
PROBS = SamplingParams(temperature=0.0, n_probs=2)


def _answers(eng: Engine) -> list[tuple[list[int], list]]:
    cases = REC["answers"]["F32"][:2]
    evs = run_and_drain(eng, [ask(c["prompt"] + c["tokens"][:20], 2, sampling=PROBS,
                                  cache_prompt=False) for c in cases])  # fmt: skip
    return [([e.token for e in ev if e.token is not None],
             [e.probs for e in ev if e.token is not None]) for ev in evs]  # fmt: skip


def test_each_engine_keeps_its_own_rope_factors(tmp_path: Path) -> None:
    path = write_model(REC, tmp_path / "phi3.gguf")
    model = load_model(path)
    short_cfg = EngineConfig(n_slots=1, n_ctx=128, block_size=4)
    long_cfg = EngineConfig(n_slots=1, n_ctx=256, block_size=4)
    short = Engine(model, short_cfg)
    before = _answers(short)
    long = Engine(model, long_cfg)  # built after: must not change the short engine's choice
    long_answers = _answers(long)
    assert _answers(short) == before, "building a longer-context engine changed another's rope"
    assert long_answers != before, "the long factors change nothing here: no test"
    assert _answers(Engine(load_model(path), long_cfg)) == long_answers
    d = model.decoder
    assert d.for_context(128) is d and d.for_context(256) is d.for_context(300)
    assert d.for_context(256).blocks is d.blocks, "a sibling shares the layers"
