"""Failure isolation over the whole engine step, over HTTP on the tiny model (issue 31 item 2).

One request at a time is made to fail, by a fault injected for it alone, at each stage of
the step outside the forward pass: its admission (the scheduler's, and the sampler's set-up),
detokenization, an out-of-vocabulary sampled id (a model whose output is wider than its
tokenizer), its stop check, and an event listener (streaming). The faulty request gets a
clear error; the others, running in the same batches, answer exactly (tokens and
probabilities) what they answer on the idle server; requests queued behind it are served.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import loraserve.engine.core as core_mod
from loraserve.engine.output import TextOutput
from loraserve.engine.request import Event, Run
from tests.server_util import Served, peft_folder, serve_in_thread

MARK = "\x07fault"  # the faulty request's extra stop string (never in any text)
GOOD = [
    {"prompt": "the cat", "n_predict": 12, "temperature": 0, "n_probs": 3},
    {"prompt": "a dog of the", "n_predict": 12, "temperature": 0.8, "seed": 5, "n_probs": 2},
    {"prompt": "they are in the way", "n_predict": 12, "temperature": 0, "stream": True},
    {"prompt": "it was the", "n_predict": 12, "temperature": 1.0, "seed": 9},
]
FAULTY = {"prompt": "the of and to in", "n_predict": 12, "temperature": 0, "stop": [MARK]}


def marked(run: Run) -> bool:
    return MARK in run.req.stop


@pytest.fixture(scope="module")
def srv() -> Iterator[Served]:
    with serve_in_thread(["-np", "3", "-c", "768", "--no-cache-prompt"]) as s:
        yield s


def answer(srv: Served, body: dict[str, Any]) -> Any:
    """What a client sees: the final JSON, or the streamed events' (content, probs, error)."""
    body = {**body, "return_tokens": True}
    if body.get("stream"):
        with httpx.stream("POST", f"{srv.url}/completion", json=body, timeout=60) as r:
            text = r.read().decode()
        events = [json.loads(e.removeprefix("data: ")) for e in text.split("\n\n") if e]
        keep = ("content", "tokens", "stop", "stop_type", "error")
        return [{k: e[k] for k in keep if k in e} for e in events]
    r = httpx.post(f"{srv.url}/completion", json=body, timeout=60)
    out = r.json()
    if r.status_code != 200:
        return r.status_code, out
    return out["content"], out["tokens"], out.get("completion_probabilities"), out["stop_type"]


@pytest.fixture(scope="module")
def idle(srv: Served) -> list[Any]:
    return [answer(srv, b) for b in GOOD]


def run_together(srv: Served) -> tuple[list[Any], Any]:
    """The good requests and the faulty one at once (the faulty one in the middle); with
    three slots, one good request queues behind the faulty one."""
    out: list[Any] = [None] * (len(GOOD) + 1)
    bodies = [*GOOD[:2], FAULTY, *GOOD[2:]]

    def go(i: int) -> None:
        out[i] = answer(srv, bodies[i])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return [*out[:2], *out[3:]], out[2]


def fault_in_output(method: str) -> Callable[..., Any]:
    original = getattr(TextOutput, method)

    def patched(self: TextOutput, *a: Any) -> Any:
        if MARK in self.stop:
            raise RuntimeError(f"injected fault in {method}")
        return original(self, *a)

    return patched


def check(srv: Served, idle: list[Any], words: str) -> None:
    good, faulty = run_together(srv)
    assert good == idle
    status, body = faulty
    assert status == 500 and body["error"]["type"] == "server_error"
    assert words in body["error"]["message"]
    assert srv.client.get("/health").status_code == 200
    assert answer(srv, GOOD[0]) == idle[0]  # the engine goes on


def test_detokenization_fails_alone(srv, idle, monkeypatch) -> None:
    monkeypatch.setattr(TextOutput, "push", fault_in_output("push"))
    check(srv, idle, "injected fault in push")


def test_stop_check_fails_alone(srv, idle, monkeypatch) -> None:
    monkeypatch.setattr(TextOutput, "_find_stop", fault_in_output("_find_stop"))
    check(srv, idle, "injected fault in _find_stop")


def test_sampler_set_up_fails_alone(srv, idle, monkeypatch) -> None:
    real_setup = core_mod.EngineCore._setup

    def setup(self: Any, run: Run) -> None:
        if marked(run):
            raise RuntimeError("injected fault at admission")
        real_setup(self, run)

    monkeypatch.setattr(core_mod.EngineCore, "_setup", setup)
    check(srv, idle, "internal error in admission")


def test_scheduler_admission_fails_alone(srv, idle, monkeypatch) -> None:
    sched = srv.app.state.server.engine.core.scheduler
    real = type(sched)._start

    def start(self: Any, slot: Any, req: Any, lead: Any = None) -> Any:
        if MARK in req.stop:
            raise RuntimeError("injected fault in the scheduler")
        return real(self, slot, req, lead)

    monkeypatch.setattr(type(sched), "_start", start)
    check(srv, idle, "internal error at admission")
    assert sched.queue.queued == 0 and not sched.waiting


def test_out_of_vocabulary_sampled_id_fails_alone(srv, idle, monkeypatch) -> None:
    """A sampled id past the tokenizer's vocabulary (as Qwen2.5's output rows are wider than
    its tokenizer) breaks only that request's detokenization."""
    real = core_mod.sample_isolated
    vocab = srv.app.state.server.engine.tokenizer.vocab_size

    def sample(logits: Any, states: Any, top: Any = None) -> Any:
        out = real(logits, states, top)
        for i, st in enumerate(states):
            if getattr(st, "_fault", False) and not isinstance(out[i], str):
                out[i] = dataclasses.replace(out[i], token=vocab + 7)
        return out

    real_setup = core_mod.EngineCore._setup

    def setup(self: Any, run: Run) -> None:
        real_setup(self, run)
        if marked(run):
            run.sampler._fault = True  # type: ignore[union-attr]

    monkeypatch.setattr(core_mod, "sample_isolated", sample)
    monkeypatch.setattr(core_mod.EngineCore, "_setup", setup)
    check(srv, idle, "internal error in post-processing")


def test_a_failing_listener_fails_nothing(srv, idle) -> None:
    """An event listener (metrics, streaming wake-ups) that raises for one request is logged;
    every request, that one included, answers as on the idle server."""
    engine = srv.app.state.server.engine

    def listener(run: Run, ev: Event) -> None:
        if marked(run):
            raise RuntimeError("injected fault in a listener")

    engine.listeners.insert(0, listener)
    try:
        good, faulty = run_together(srv)
    finally:
        engine.listeners.remove(listener)
    assert good == idle
    alone = answer(srv, FAULTY)
    assert faulty == alone and alone[3] == "limit"


@pytest.fixture(scope="module")
def lora_srv(tmp_path_factory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("iso-step-loras")
    peft_folder(d / "up", 3)
    with serve_in_thread(["-np", "2", "-c", "512", "--lora-dir", str(d)]) as s:
        yield s


def test_a_parked_submission_that_cannot_enter_fails_alone(lora_srv, monkeypatch) -> None:
    """Two submissions wait (parked) for the same adapter's first read; when it arrives, the
    first one's entry into the scheduler raises: it fails alone, the second is served as it
    is on the idle server (it used to be dropped, its client left hanging)."""
    engine = lora_srv.app.state.server.engine
    reg = engine.core.adapters
    gate = threading.Event()
    real_read, real_key = reg.read, reg.request_key
    real_path_read = engine.loads.prefetch._read  # the read started at submit time

    def held_read(adapter_id: int) -> Any:
        assert gate.wait(60)
        return real_read(adapter_id)

    def held_path_read(path: Any) -> Any:
        assert gate.wait(60)
        return real_path_read(path)

    def key(scales: Any, prompt: Any) -> Any:
        if prompt[-2:] == [299, 299]:
            raise RuntimeError("injected fault entering the scheduler")
        return real_key(scales, prompt)

    monkeypatch.setattr(reg, "read", held_read)
    monkeypatch.setattr(engine.loads.prefetch, "_read", held_path_read)
    monkeypatch.setattr(reg, "request_key", key)
    lora = [{"name": "up", "scale": 1.0}]
    good = {"prompt": "the cat", "n_predict": 8, "temperature": 0, "lora": lora}
    bad = {**good, "prompt": [1, 40, 299, 299]}
    out: dict[str, httpx.Response] = {}

    def go(name: str, body: dict[str, Any]) -> None:
        out[name] = httpx.post(f"{lora_srv.url}/completion", json=body, timeout=60)

    threads = [threading.Thread(target=go, args=a) for a in (("bad", bad), ("good", good))]
    try:
        for t in threads:
            t.start()
            deadline = time.monotonic() + 30
            while len(engine.loads._parked) < threads.index(t) + 1:
                assert time.monotonic() < deadline, "the submission did not park"
                time.sleep(0.01)
    finally:
        gate.set()
        for t in threads:
            t.join(60)
    assert out["bad"].status_code == 500
    assert "injected fault" in out["bad"].json()["error"]["message"]
    assert out["good"].status_code == 200
    again = httpx.post(f"{lora_srv.url}/completion", json=good, timeout=60).json()
    assert out["good"].json()["content"] == again["content"]
