"""The bug loraserve exists to make impossible (llama.cpp #30366, #26207).

llama-server reuses KV computed under the old global adapters after `POST /lora-adapters`
changes them (and on the reverse path, explicit `lora` then none). Here every answer must
equal its cache-off answer and `cache_n` must count only KV computed under the request's
own configuration — on a tiny model and on the real one with the demo adapters.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server_util import peft_folder, serve_in_thread

PROMPT_TINY = "the cat and the dog of the house is in the"
PROMPT_REAL = "Question: What should I pack for a weekend trip to the mountains?\nAnswer:"


@pytest.fixture(scope="module")
def tiny_adapters(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("seed-loras")
    return [peft_folder(d / "a", 11), peft_folder(d / "b", 12)]


def _servers(model_args: list[str], adapters: list[Path], ctx: str):
    lora = [x for p in adapters for x in ("--lora", str(p))]
    for cram in (["--cache-ram", "0"], []):  # no prefix cache beyond the slot, then default
        yield ["-np", "1", "-c", ctx, "--lora-init-without-apply", *cram, *lora, *model_args]


def complete(srv, prompt: str, **kw) -> dict:
    body = {"prompt": prompt, "n_predict": 12, "temperature": 0, "ignore_eos": True, **kw}
    r = srv.client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def set_global(srv, scales: dict[int, float]) -> None:
    r = srv.client.post("/lora-adapters", json=[{"id": i, "scale": s} for i, s in scales.items()])
    assert r.status_code == 200 and r.json() == {"success": True}


def check_seed_sequence(srv, prompt: str) -> None:
    n_prompt = len(
        srv.client.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
    )
    # (a) all scales 0, (b) a completion without `lora`
    set_global(srv, {0: 0.0, 1: 0.0})
    base = complete(srv, prompt)
    assert base["generation_settings"]["lora"] == []
    # (c) adapter 0 on globally, (d) the same completion: nothing was computed under it
    set_global(srv, {0: 1.0})
    switched = complete(srv, prompt)
    ref = complete(srv, prompt, cache_prompt=False)
    assert switched["timings"]["cache_n"] == 0
    assert switched["content"] == ref["content"] != base["content"]
    # (e) once more: now it was, and the output is unchanged
    again = complete(srv, prompt)
    assert again["timings"]["cache_n"] == n_prompt - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == ref["content"]
    # the reverse path: explicit `lora` mix, then none under a different global mix
    set_global(srv, {1: 1.0})
    explicit = complete(srv, prompt, lora=[{"id": 0, "scale": 1.0}])
    assert explicit["content"] == ref["content"]
    implicit = complete(srv, prompt)  # global: adapter 1 only
    ref1 = complete(srv, prompt, cache_prompt=False)
    assert implicit["content"] == ref1["content"] != ref["content"]
    assert implicit["generation_settings"]["lora"] == [{"id": 1, "scale": 1.0}]


def check_warm_return(srv, prompt: str) -> None:
    """A, then B, then A again: with a cache budget A's prefix is still warm."""
    a, b = [{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 0.5}]
    ref_a = complete(srv, prompt, lora=a, cache_prompt=False)["content"]
    complete(srv, prompt, lora=a)
    complete(srv, prompt, lora=b)
    third = complete(srv, prompt, lora=a)
    assert third["timings"]["cache_n"] > 0 and third["content"] == ref_a


def test_seed_sequence_tiny(tiny_adapters) -> None:
    for args in _servers([], tiny_adapters, "256"):
        with serve_in_thread(args) as srv:
            check_seed_sequence(srv, PROMPT_TINY)
            if "--cache-ram" not in args:
                check_warm_return(srv, PROMPT_TINY)


@pytest.mark.real_model
def test_seed_sequence_real_model(real_model_path) -> None:
    from loraserve.model.loader import load_model

    demo = Path(__file__).resolve().parents[2] / "loraserve" / "adapters"
    adapters = [demo / "uppercase.gguf", demo / "titlecase"]
    model = load_model(real_model_path)
    for args in _servers(["-m", str(real_model_path)], adapters, "2048"):
        with serve_in_thread(args, model=model) as srv:
            check_seed_sequence(srv, PROMPT_REAL)
            if "--cache-ram" not in args:
                check_warm_return(srv, PROMPT_REAL)
