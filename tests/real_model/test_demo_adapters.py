"""The demo adapters change the real model's style as documented, in one mixed batch."""

from __future__ import annotations

import pytest

from loraserve.adapters import gguf_path, is_titlecase, is_uppercase, peft_dir, uppercase_fraction
from loraserve.engine.engine import Engine, EngineConfig
from loraserve.model.loader import load_model
from tests.engine_util import ask, run_and_drain, text_of

pytestmark = pytest.mark.real_model
PROMPTS = [
    "Question: Why do cats purr?\nAnswer:",
    "Dear diary, today I",
    "The best thing about living near the sea is",
    "Q: How do I make a cup of tea?\nA:",
]


@pytest.fixture(scope="module")
def engine(real_model_path) -> Engine:
    eng = Engine(load_model(real_model_path), EngineConfig(n_slots=8, n_ctx=4096))
    eng.load_adapter(gguf_path("uppercase"), scale=0.0).result()  # id 0 (GGUF form)
    eng.load_adapter(peft_dir("titlecase"), scale=0.0).result()  # id 1 (PEFT form)
    return eng


def generate_all(eng: Engine, jobs: list[tuple[str, dict[int, float]]]) -> list[str]:
    """All jobs in one batch (different mixes side by side), greedy, 32 tokens."""
    asks = [ask(eng.tokenizer.encode(p), 32, mix) for p, mix in jobs]
    return [text_of(evs) for evs in run_and_drain(eng, asks)]


def test_styles_on_and_off_in_one_batch(engine) -> None:
    jobs = [(p, mix) for p in PROMPTS for mix in ({}, {0: 1.0}, {1: 1.0})]
    texts = generate_all(engine, jobs)
    for (prompt, mix), text in zip(jobs, texts, strict=True):
        assert len([c for c in text if c.isalpha()]) >= 20, (prompt, text)
        if mix == {0: 1.0}:
            assert is_uppercase(text), (prompt, text)
        elif mix == {1: 1.0}:
            assert is_titlecase(text), (prompt, text)
        else:
            assert uppercase_fraction(text) < 0.5 and not is_titlecase(text), (prompt, text)


def test_zero_scale_is_the_base_model(engine) -> None:
    base, zero = generate_all(engine, [(PROMPTS[0], {}), (PROMPTS[0], {0: 0.0, 1: 0.0})])
    assert base == zero
