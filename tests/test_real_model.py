"""Gemma 3 270M (the real default model) against transformers' float32 forward (recorded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.request import Request
from loraserve.engine.sampling_params import SamplingParams
from loraserve.model.loader import LoadedModel, load_model
from tests.tiny import our_logits

pytestmark = pytest.mark.real_model
REF = json.loads((Path(__file__).parent / "data/gemma3_hf_reference.json").read_text())
EXPECTED = (
    " the capital of the country of France. It is the largest city in France and the second"
    " largest city"
)


@pytest.fixture(scope="module")
def f32(real_model_path) -> LoadedModel:
    return load_model(real_model_path)


@pytest.fixture(scope="module")
def fast(real_model_path) -> LoadedModel:
    return load_model(real_model_path, int8=True)


def greedy(model: LoadedModel, ids: list[int], n: int) -> list[int]:
    eng = Engine(model, EngineConfig(n_ctx=1024))
    req = Request(prompt=ids, sampling=SamplingParams(temperature=0.0), max_tokens=n)
    eng.submit(req)
    eng.run_until_idle()
    out = []
    while not req.events.empty():
        ev = req.events.get()
        if ev.token is not None:
            out.append(ev.token)
    return out


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


def test_int8_greedy_only_departs_at_a_near_tie(fast, f32) -> None:
    """Greedy int8 decoding follows float32's until a position whose float32 gap < 0.5."""
    ref, n = REF["greedy_ids"], len(REF["prompt_ids"])
    got = greedy(fast, REF["prompt_ids"], 20)
    if got == ref:
        return
    k = next(i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b)
    top2 = our_logits(f32, REF["prompt_ids"] + ref, chunk=n + len(ref)).topk(2, dim=-1).values
    gap = (top2[n - 1 + k, 0] - top2[n - 1 + k, 1]).item()
    assert gap < 0.5, f"int8 left float32's greedy path at token {k}, where the gap is {gap}"


def test_int8_default_is_faithful_where_the_gap_is_clear(fast) -> None:
    """int8 weights may flip near-ties only: equal top-1 wherever the float32 gap >= 0.5."""
    ids = REF["passage_ids"]
    torch.manual_seed(0)
    prefill = our_logits(fast, ids, chunk=len(ids)).argmax(-1).tolist()
    decode = our_logits(fast, ids[:120], chunk=1).argmax(-1).tolist()  # the int8 decode path
    clear = [i for i, g in enumerate(REF["gap"]) if g >= 0.5]
    assert all(prefill[i] == REF["top1"][i] for i in clear)
    assert all(decode[i] == REF["top1"][i] for i in clear if i < 120)


def test_prepared_weights_cache_gives_the_same_model(fast, real_model_path) -> None:
    """The second load reads the int8 cache written by the first: same tokens."""
    from loraserve.model.prepared import prepared_cache_file

    assert prepared_cache_file(real_model_path).is_file()
    again = load_model(real_model_path, int8=True)
    ids = REF["prompt_ids"]
    assert greedy(again, ids, 8) == greedy(fast, ids, 8)


def test_int8_cache_on_equals_cache_off(fast) -> None:
    """Prompt rows always use the float weights, so resuming a prompt from the prefix cache
    (a few rows) computes exactly what a cold prefill (hundreds of rows) does."""
    tok = fast.tokenizer
    head = REF["passage"][:400]
    eng = Engine(fast, EngineConfig(n_ctx=2048, n_slots=2))

    def run(prompt: str, cache: bool) -> tuple[list[int], int]:
        req = Request(
            prompt=tok.encode(prompt),
            sampling=SamplingParams(temperature=0.0),
            max_tokens=24,
            cache_prompt=cache,
        )
        eng.submit(req)
        eng.run_until_idle()
        toks, cached = [], 0
        while not req.events.empty():
            ev = req.events.get()
            if ev.token is not None:
                toks.append(ev.token)
            if ev.done:
                cached = ev.n_cached
        return toks, cached

    run(head, True)
    for suffix in (" And then", " The", ", said the miller's daughter."):
        warm, cached = run(head + suffix, True)
        cold, _ = run(head + suffix, False)
        assert cached > 50 and warm == cold
