"""The router's queue for models that wait for room under `--models-max`, as llama.cpp's
suite asks of llama-server's router (tools/server/tests/unit/test_router.py, the
`test_router_queue_*` tests, which cannot run offline there: they need ggml-org models in
the download cache), here on tiny models in a `--models-dir`:

- a model serving a request is never evicted for another one;
- requests for a model that waits for room share its one load (one eviction, not three);
- a client that leaves while its model waits for room costs no running model its place:
  the queued load is dropped (`unloaded`), the running model stays;
- two requests for two other models that arrive together are both served, in arrival
  order, each model kept until its waiting request is served (they deadlocked: a model
  waiting for room was counted as holding one);

A model is held busy by its engine process being stopped (SIGSTOP) while one of its
requests is in flight, so what is busy when is exact, not a matter of sleeps."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.http.router_util import router, status, wait_status
from tests.server_util import tiny_model_path
from tests.tiny import hf_model, write_gguf

A, B, C = "tiny", "other", "third"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("queue-models")
    shutil.copy(tiny_model_path(), d / f"{A}.gguf")
    write_gguf(d / f"{B}.gguf", hf_model("llama", seed=11), "llama")
    write_gguf(d / f"{C}.gguf", hf_model("llama", seed=12), "llama")
    return d


def tokenize(c: httpx.Client, model: str, out: list, timeout: float = 60) -> threading.Thread:
    """POST /tokenize for `model` in a thread; its answer (or error) and end time in `out`."""

    def run() -> None:
        try:
            r = c.post("/tokenize", json={"model": model, "content": "hi"}, timeout=timeout)
            out.append((r.status_code, time.monotonic()))
        except httpx.HTTPError as e:
            out.append((type(e).__name__, time.monotonic()))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def engine_of(state: object, name: str):
    preset = state.find(name)  # type: ignore[attr-defined]
    return state.pool.engines[preset.key]  # type: ignore[attr-defined]


@contextmanager
def held_busy(c: httpx.Client, state: object, name: str) -> Iterator[list]:
    """`name` serving a completion that cannot finish until the block ends (its engine
    process is stopped meanwhile); yields the completion's answer list."""
    eng = engine_of(state, name)
    pid = eng.host.pid
    os.kill(pid, signal.SIGSTOP)
    out: list = []

    def run() -> None:
        body = {"model": name, "prompt": "x", "n_predict": 1}
        r = c.post("/completion", json=body, timeout=60)
        out.append(r.status_code if r.status_code == 200 else (r.status_code, r.text))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_for(lambda: eng.busy == 1, "the completion never reached its engine")
    try:
        yield out
    finally:
        os.kill(pid, signal.SIGCONT)
        t.join(60)


def wait_for(cond, why: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, why
        time.sleep(0.01)


def load(c: httpx.Client, name: str) -> None:
    assert c.post("/models/load", json={"model": name}).json() == {"success": True}
    wait_status(c, name, "loaded")


def test_busy_model_kept_and_waiters_coalesce(models_dir: Path) -> None:
    with router(["--models-dir", str(models_dir), "--models-max", "2", "-np", "1"]) as (c, st):
        load(c, A)
        load(c, B)
        with held_busy(c, st, A) as busy:
            out: list = []
            threads = [tokenize(c, C, out) for _ in range(3)]
            for t in threads:
                t.join(60)
            assert [code for code, _ in out] == [200] * 3
        assert busy == [200]
        assert status(c, C)["value"] == "loaded"
        assert status(c, A)["value"] == "loaded"  # one eviction for three requests: B's
        assert status(c, B)["value"] == "unloaded"


def test_client_leaving_the_queue_keeps_the_running_model(models_dir: Path) -> None:
    with router(["--models-dir", str(models_dir), "--models-max", "1", "-np", "1"]) as (c, st):
        load(c, A)
        with held_busy(c, st, A) as busy:
            out: list = []
            tokenize(c, B, out, timeout=1).join(30)
            assert out and out[0][0] == "ReadTimeout"
            # nobody waits for B any more: its queued load is dropped
            wait_for(lambda: status(c, B)["value"] == "unloaded", "B's load was kept")
        assert busy == [200]
        assert status(c, A)["value"] == "loaded"
        assert status(c, B)["value"] == "unloaded"
        assert not engine_of(st, B).failed


def test_queued_models_served_in_arrival_order(models_dir: Path) -> None:
    with router(["--models-dir", str(models_dir), "--models-max", "1", "-np", "1"]) as (c, st):
        load(c, A)
        out_b: list = []
        out_c: list = []
        with held_busy(c, st, A) as busy:
            tb = tokenize(c, B, out_b)
            wait_for(lambda: status(c, B)["value"] == "loading", "B never queued")
            tc = tokenize(c, C, out_c)
            wait_for(lambda: status(c, C)["value"] == "loading", "C never queued")
        tb.join(60)
        tc.join(60)
        assert busy == [200]
        assert out_b and out_b[0][0] == 200, out_b
        assert out_c and out_c[0][0] == 200, out_c
        assert out_b[0][1] < out_c[0][1]
        assert status(c, A)["value"] == "unloaded"


def test_two_waiters_share_one_eviction(models_dir: Path) -> None:
    with router(["--models-dir", str(models_dir), "--models-max", "1", "-np", "1"]) as (c, _):
        load(c, A)
        out: list = []
        threads = [tokenize(c, B, out), tokenize(c, C, out)]
        for t in threads:
            t.join(60)
        assert sorted(code for code, _ in out) == [200, 200], out
        assert status(c, A)["value"] == "unloaded"
        loaded = [n for n in (B, C) if status(c, n)["value"] == "loaded"]
        assert len(loaded) == 1


def test_llama_servers_debug_delays_follow_its_variable(monkeypatch) -> None:
    """llama.cpp's suite sets LLAMA_SERVER_DEBUG_FAKE_TIMING for its queue tests (a request
    counted busy, and a load, each wait 2 s in llama-server's router): read as it is."""
    from loraserve.server.router.pool import Pool

    monkeypatch.delenv("LLAMA_SERVER_DEBUG_FAKE_TIMING", raising=False)
    assert Pool(1).fake_delay_s == 0.0
    monkeypatch.setenv("LLAMA_SERVER_DEBUG_FAKE_TIMING", "1")
    assert Pool(1).fake_delay_s == 2.0
