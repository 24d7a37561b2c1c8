"""Gemma 3 270M (the real default model) against transformers' float32 forward (recorded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from loraserve.model.loader import LoadedModel, load_model
from tests.engine_util import ask, run_and_drain, run_one, tokens
from tests.tiny import our_logits

pytestmark = pytest.mark.real_model
REF = json.loads(
    (Path(__file__).resolve().parents[1] / "data/gemma3_hf_reference.json").read_text()
)
EXPECTED = (
    " the capital of the country of France. It is the largest city in France and the second"
    " largest city"
)


@pytest.fixture(scope="module")
def f32(real_model_path) -> LoadedModel:
    return load_model(real_model_path, "float32")


@pytest.fixture(scope="module")
def native(real_model_path) -> LoadedModel:
    return load_model(real_model_path)


def greedy(model: LoadedModel, ids: list[int], n: int) -> list[int]:
    return run_one(Engine(model, EngineConfig(n_ctx=1024)), ids, n)


def test_tokenizer_matches_reference_ids(f32) -> None:
    assert f32.tokenizer.encode(REF["prompt"]) == REF["prompt_ids"]


def test_float32_greedy_equals_transformers(f32) -> None:
    got = greedy(f32, REF["prompt_ids"], 20)
    assert got == REF["greedy_ids"]
    assert f32.tokenizer.decode(got) == EXPECTED == REF["greedy_text"]


def test_float32_teacher_forced_agreement(f32) -> None:
    ids = REF["passage_ids"]
    top1 = our_logits(f32, ids, chunk=len(ids)).argmax(-1).tolist()
    agree = sum(a == b for a, b in zip(top1, REF["top1"], strict=True)) / len(ids)
    assert len(ids) >= 250 and agree >= 0.99, f"top-1 agreement {agree:.3f}"


def test_native_greedy_only_departs_at_a_near_tie(native, f32) -> None:
    """Greedy decoding on the file's own weights follows float32's until a position whose
    float32 top-1/top-2 gap is < 0.5."""
    ref, n = REF["greedy_ids"], len(REF["prompt_ids"])
    got = greedy(native, REF["prompt_ids"], 20)
    if got == ref:
        return
    k = next(i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b)
    top2 = our_logits(f32, REF["prompt_ids"] + ref, chunk=n + len(ref)).topk(2, dim=-1).values
    gap = (top2[n - 1 + k, 0] - top2[n - 1 + k, 1]).item()
    assert gap < 0.5, f"native left float32's greedy path at token {k}, where the gap is {gap}"


def test_native_is_faithful_where_the_gap_is_clear(native) -> None:
    """The quantized weights may flip near-ties only: the same top-1 as transformers' float32
    wherever its gap >= 0.5, prefilled in one chunk or decoded token by token; and decode
    computes bitwise what the prefill does at every position."""
    ids = REF["passage_ids"]
    prefill = our_logits(native, ids, chunk=len(ids))
    decode = our_logits(native, ids[:120], chunk=1)
    assert torch.equal(decode, prefill[:120])
    top1 = prefill.argmax(-1).tolist()
    clear = [i for i, g in enumerate(REF["gap"]) if g >= 0.5]
    assert all(top1[i] == REF["top1"][i] for i in clear)


def test_native_cache_on_equals_cache_off(native) -> None:
    """Resuming a prompt from the prefix cache (a few rows evaluated) gives bitwise the logits
    of a cold prefill (hundreds of rows), so the same tokens and probabilities."""
    tok = native.tokenizer
    head = REF["passage"][:400]
    eng = Engine(native, EngineConfig(n_ctx=2048, n_slots=2))

    def run(prompt: str, cache: bool) -> tuple[list[int], list, int]:
        sampling = SamplingParams(temperature=0.0, n_probs=5)
        asked = ask(tok.encode(prompt), 24, sampling=sampling, cache_prompt=cache)
        (evs,) = run_and_drain(eng, [asked])
        return tokens(evs), [e.probs for e in evs if e.token is not None], evs[-1].n_cached

    run(head, True)
    for suffix in (" And then", " The", ", said the miller's daughter."):
        warm, warm_probs, cached = run(head + suffix, True)
        cold, cold_probs, _ = run(head + suffix, False)
        assert cached > 50 and warm == cold and warm_probs == cold_probs
