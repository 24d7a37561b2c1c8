"""Speculative decoding over HTTP on the tiny model: llama-server's flags start it, answers
carry `timings.draft_n` / `draft_n_accepted` and echo `speculative.*` in
`generation_settings`, the request fields are checked (a 400 naming the field), /metrics
counts drafts (llama-server's counters and ours per adapter), and random completions
(adapter mixes, shared prefixes, cache on and off, pinned slots, concurrent pairs) equal the
same request alone with speculation and the cache off (hypothesis)."""

from __future__ import annotations

import functools
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from tests.server_util import peft_folder, scrape_metrics, serve_in_thread, tiny_model

SPEC = [
    "--spec-type",
    "ngram-simple,ngram-mod",
    "--spec-ngram-simple-size-n",
    "2",
    "--spec-ngram-simple-size-m",
    "6",
    "--spec-ngram-mod-n-match",
    "2",
    "--spec-ngram-mod-n-min",
    "1",
    "--spec-ngram-mod-n-max",
    "6",
]
N_PREDICT = 24


@functools.cache
def adapter_dir():
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp(prefix="loraserve-spec-http-"))
    for name, seed in (("a", 41), ("b", 42)):
        peft_folder(d / name, seed)
    return d


def args() -> list[str]:
    d = adapter_dir()
    return ["-np", "2", "-c", "1024", "--metrics", "--lora", str(d / "a"), "--lora", str(d / "b")]


@functools.cache
def reference_engine() -> Engine:
    eng = Engine(tiny_model(), EngineConfig(n_ctx=512, cache_ram_mib=0))
    for name in ("a", "b"):
        eng.load_adapter(adapter_dir() / name, 0.0).result()
    return eng


_REFERENCE_LOCK = threading.Lock()  # the client threads share the reference engine


def reference(prompt: tuple[int, ...], lora: tuple[tuple[int, float], ...]) -> tuple[int, ...]:
    """Greedy tokens alone, speculation and cache off (the server's global scales are 1, 1)."""
    with _REFERENCE_LOCK:
        return _reference(prompt, lora)


@functools.cache
def _reference(prompt: tuple[int, ...], lora: tuple[tuple[int, float], ...]) -> tuple[int, ...]:
    eng = reference_engine()
    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    mix = list(lora) if lora else [(0, 1.0), (1, 1.0)]
    req = eng.submit([list(prompt)], sampling, max_tokens=N_PREDICT, lora=mix, cache_prompt=False)
    eng.run_until_idle()
    r = req.requests[0]
    toks = []
    while not r.events.empty():
        ev = r.events.get()
        if ev.token is not None:
            toks.append(ev.token)
    return tuple(toks)


def body(prompt: list[int], lora: list[tuple[int, float]] | None, **kw) -> dict:
    out = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "ignore_eos": True}
    out |= {"return_tokens": True, **kw}
    if lora is not None:
        out["lora"] = [{"id": i, "scale": s} for i, s in lora]
    return out


PHRASE = [1, 30, 31, 32, 33, 34, 35]


def test_answers_report_drafts_and_metrics_count_them() -> None:
    prompt = PHRASE + PHRASE[1:] * 3
    with serve_in_thread(args() + SPEC) as srv:
        res = srv.client.post("/completion", json=body(prompt, [(1, 1.0)])).json()
        assert tuple(res["tokens"]) == reference(tuple(prompt), ((1, 1.0),))
        t = res["timings"]
        assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"]
        g = res["generation_settings"]
        assert g["speculative.types"] == "ngram-simple,ngram-mod"
        assert (g["speculative.n_max"], g["speculative.n_min"], g["speculative.p_min"]) == (3, 0, 0)
        assert all(slot["speculative"] for slot in srv.client.get("/slots").json())
        props = srv.client.get("/props").json()["default_generation_settings"]["params"]
        assert props["speculative.types"] == "ngram-simple,ngram-mod"
        off = srv.client.post("/completion", json=body(prompt, None, **{"speculative.n_max": 0}))
        assert "draft_n" not in off.json()["timings"]  # as llama-server: only with drafts
        assert off.json()["generation_settings"]["speculative.n_max"] == 0
        m = scrape_metrics(srv)
        assert m["llamacpp:spec_decode_num_draft_tokens_total"] == t["draft_n"]
        assert m["llamacpp:spec_decode_num_accepted_tokens_total"] == t["draft_n_accepted"]
        assert m["llamacpp:spec_decode_num_drafts_total"] >= 1
        text = srv.client.get("/metrics").text
        assert f'loraserve:adapter_draft_tokens_total{{id="1",name="b"}} {t["draft_n"]}' in text
        accepted = t["draft_n_accepted"]
        assert f'loraserve:adapter_draft_accepted_total{{id="1",name="b"}} {accepted}' in text
        assert 'loraserve:adapter_draft_tokens_total{id="0",name="a"} 0' in text


@pytest.mark.parametrize(
    "field, value",
    [("speculative.n_max", -1), ("speculative.n_min", "2"), ("speculative.p_min", 1.5)],
)
def test_bad_speculative_fields_are_a_400_naming_them(field: str, value: object) -> None:
    with serve_in_thread(args() + SPEC) as srv:
        r = srv.client.post("/completion", json={"prompt": "hi", field: value})
        assert r.status_code == 400
        assert field in r.json()["error"]["message"]
        assert srv.client.get("/health").status_code == 200


completion = st.fixed_dictionaries(
    {
        "repeats": st.integers(1, 4),
        "cut": st.integers(2, 7),
        "suffix": st.lists(st.integers(3, 319), max_size=4),
        "lora": st.one_of(
            st.none(),
            st.lists(
                st.tuples(st.integers(0, 1), st.sampled_from([0.0, 0.5, 1.0])),
                min_size=1,
                max_size=2,
                unique_by=lambda x: x[0],
            ),
        ),
        "cache_prompt": st.booleans(),
        "id_slot": st.sampled_from([-1, -1, 0, 1]),
    }
)


def run_completion(srv, c: dict) -> None:
    prompt = PHRASE[: c["cut"]] * c["repeats"] + c["suffix"]
    lora = c["lora"]
    extra = {"cache_prompt": c["cache_prompt"], "id_slot": c["id_slot"]}
    r = srv.client.post("/completion", json=body(prompt, lora, **extra))
    assert r.status_code == 200, r.text
    key = tuple(lora) if lora else ()
    assert tuple(r.json()["tokens"]) == reference(tuple(prompt), key), "differs from spec off"


def _collect(srv, c: dict, errors: list[BaseException]) -> None:
    try:
        run_completion(srv, c)
    except BaseException as e:  # re-raised in the test thread
        errors.append(e)


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(completion, st.one_of(st.none(), completion)), min_size=1, max_size=6))
def test_every_answer_equals_speculation_and_cache_off(ops) -> None:
    with serve_in_thread(args() + SPEC + ["--cache-ram", "1"]) as srv:
        for first, second in ops:
            if second is None:
                run_completion(srv, first)
                continue
            errors: list[BaseException] = []
            threads = [
                threading.Thread(target=_collect, args=(srv, c, errors)) for c in (first, second)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            if errors:
                raise errors[0]
        assert srv.client.get("/health").status_code == 200


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_constrained_answers_equal_speculation_off(temperature: float) -> None:
    """Each verified row gets the grammar's mask after the tokens before it: answers under a
    grammar or a JSON schema are those of speculation off (greedy and seeded)."""
    bodies = [
        {"prompt": "ab", "grammar": 'root ::= ("ab" | "ba" | "abc"){3,40}', "n_predict": 60},
        {"prompt": "x", "json_schema": {"type": "array", "items": {"enum": ["ab", "ba"]}},
         "n_predict": 60},
    ]  # fmt: skip
    out = {}
    for name, extra in (("off", []), ("on", SPEC)):
        with serve_in_thread(args() + extra) as srv:
            out[name] = []
            for b in bodies:
                for seed in range(3):
                    body = {**b, "temperature": temperature, "seed": seed, "return_tokens": True}
                    r = srv.client.post("/completion", json=body)
                    assert r.status_code == 200, r.text
                    out[name].append((r.json()["tokens"], r.json()["timings"].get("draft_n", 0)))
    assert [t for t, _ in out["on"]] == [t for t, _ in out["off"]]
    assert sum(n for _, n in out["on"]) > 0
