"""Fidelity to llama.cpp (recorded by scripts/record_peer_reference.py): on Gemma 3 270M, with
and without the demo adapters, loraserve's default (file-native) engine picks llama.cpp's greedy
token at every position where llama.cpp's own top-1/top-2 logit gap is at least 0.5, teacher-
forced on llama.cpp's answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraserve.adapters import gguf_path
from loraserve.lora.registry import AdapterRegistry
from loraserve.model.loader import LoadedModel, load_model
from tests.tiny import our_logits

pytestmark = pytest.mark.real_model
REF = json.loads((Path(__file__).resolve().parents[1] / "data/peer_greedy.json").read_text())


@pytest.fixture(scope="module")
def native(real_model_path) -> tuple[LoadedModel, AdapterRegistry]:
    model = load_model(real_model_path)
    reg = AdapterRegistry(model)
    for name in REF["meta"]["adapters"]:
        reg.load(gguf_path(Path(name).stem), scale=0.0)
    return model, reg


@pytest.mark.parametrize("mix", ["base", "uppercase", "titlecase", "both"])
def test_greedy_tokens_equal_llama_cpp_where_its_gap_is_clear(native, mix: str) -> None:
    model, reg = native
    checked = 0
    for rec in (r for r in REF["records"] if r["mix"] == mix):
        prompt = model.tokenizer.encode(rec["prompt"])  # with BOS, as llama-server adds it
        ids = prompt + rec["tokens"]
        scales = {i: s for i, s in enumerate(rec["scales"]) if s}
        logits = our_logits(model, ids, chunk=len(ids), mix=scales, lora_builder=reg.build_delta)
        ours = logits[len(prompt) - 1 : -1].argmax(-1).tolist()  # the next token at each step
        for k, (a, b, gap) in enumerate(zip(ours, rec["tokens"], rec["gap"], strict=True)):
            if gap >= 0.5:
                checked += 1
                assert a == b, f"{mix} {rec['prompt']!r} token {k}: ours {a}, llama.cpp {b}"
    assert checked >= 60
