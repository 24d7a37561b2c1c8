"""Start-up and shutdown: 503 while the model loads (or after it failed to), progress lines
while it loads and one log line per request; a busy port or a bad model or adapter file is
one error line and exit 1 before anything loads; SIGTERM in a real server process: requests
that finish within the grace period finish; past it, the server has stopped accepting at
once, cancels what is still running (a plain request answers 503 `unavailable_error`, a
stream ends with that error event), and exits 0 either way; Ctrl-C says what it waits for,
and a second one exits at once without tracebacks."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from loraserve.server import startup
from tests.server_util import (
    free_socket,
    serve_in_thread,
    start_process,
    tiny_model,
    tiny_model_path,
)

DEMO_DIR = Path(__file__).resolve().parents[2] / "loraserve" / "adapters"

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
GRACE_S = 1.0
SHUTTING_DOWN = {"code": 503, "message": "the server is shutting down", "type": "unavailable_error"}


def test_503_while_loading_then_ready() -> None:
    gate = threading.Event()

    def slow_loader():
        assert gate.wait(30)
        return tiny_model()

    with serve_in_thread([], loader=slow_loader, wait_ready=False) as s:
        r = s.client.get("/health")
        assert r.status_code == 503 and r.json() == LOADING
        for method, path in (("POST", "/completion"), ("GET", "/props"), ("GET", "/v1/models")):
            r = s.client.request(method, path, json={"prompt": "a"})
            assert r.status_code == 503 and r.json() == LOADING, path
        gate.set()
        deadline = time.monotonic() + 20
        while s.client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = s.client.post("/completion", json={"prompt": "a", "n_predict": 2})
        assert r.status_code == 200


def test_failed_load_answers_503_with_the_reason() -> None:
    def broken_loader():
        raise FileNotFoundError("no such model file")

    with serve_in_thread([], loader=broken_loader, wait_ready=False) as s:
        deadline = time.monotonic() + 10
        while "failed" not in (body := s.client.get("/health").json())["error"]["message"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert body["error"]["type"] == "unavailable_error"
        assert "no such model file" in body["error"]["message"]


def test_sigterm_finishes_in_flight_requests_and_exits_0() -> None:
    proc, url = start_process(["-np", "2", "-c", "512", "--temp", "0"])
    events: list[dict] = []
    started = threading.Event()

    def stream() -> None:
        body = {"prompt": "the", "n_predict": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/completion", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    started.set()

    try:
        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(20)
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 200
    try:
        httpx.get(f"{url}/health", timeout=2)
        raise AssertionError("the server still accepts connections")
    except httpx.TransportError:
        pass


def test_sigterm_cancels_what_outlasts_the_grace_period_and_exits_0() -> None:
    proc, url = start_process(["-np", "2", "-c", "8192", "--temp", "0"], grace_s=GRACE_S)
    body = {"prompt": "the", "n_predict": 4000, "ignore_eos": True}
    events: list[dict] = []
    plain: list[object] = []
    started = threading.Event()

    def stream() -> None:
        try:
            with httpx.stream("POST", f"{url}/completion", json={**body, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        started.set()
        except httpx.TransportError as e:
            events.append({"transport_error": str(e)})

    def post() -> None:
        try:
            plain.append(httpx.post(f"{url}/completion", json=body, timeout=60))
        except httpx.TransportError as e:
            plain.append(e)

    threads = [threading.Thread(target=stream), threading.Thread(target=post)]
    try:
        for t in threads:
            t.start()
        assert started.wait(30)
        time.sleep(0.2)  # the plain request is in flight too
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        try:
            httpx.get(f"{url}/health", timeout=2)
            raise AssertionError("a new connection was accepted during shutdown")
        except httpx.TransportError:
            pass
        assert proc.wait(30) == 0, proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        elapsed = time.monotonic() - t0
        for t in threads:
            t.join(30)
            assert not t.is_alive(), "a client was left hanging"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert elapsed < GRACE_S + 10, elapsed
    tokens = [e for e in events if "tokens" in e and e.get("stop") is False]
    assert 0 < len(tokens) < 4000 and not any(e.get("stop") is True for e in events)
    assert events[-1] == {"error": SHUTTING_DOWN}, events[-1]  # the stream ends cleanly
    (r,) = plain
    assert isinstance(r, httpx.Response), r
    assert r.status_code == 503 and r.json() == {"error": SHUTTING_DOWN}


def test_missing_model_exits_1() -> None:
    cmd = [sys.executable, "-m", "loraserve.cli", "-m", "/nonexistent/model.gguf", "--port", "0"]
    done = subprocess.run(cmd, capture_output=True, timeout=60)
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    assert b"model not found" in done.stderr


def run_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "loraserve.cli", "-m", str(tiny_model_path()), "-t", "1", *args]
    return subprocess.run(cmd, capture_output=True, timeout=120, text=True)


def assert_one_clear_failure(done: subprocess.CompletedProcess, *needles: str) -> None:
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert all(n in errors[0] for n in needles), errors[0]
    for noise in ("Traceback", "terminate called", "Uvicorn running", "listening on", "loaded "):
        assert noise not in done.stderr, done.stderr  # nothing started, nothing loaded


def test_a_busy_port_is_one_line_and_exit_1_before_the_model_loads() -> None:
    with free_socket() as taken:
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("--port", str(port))
    assert_one_clear_failure(done, f"cannot listen on 127.0.0.1:{port}", "in use", "--port")


def test_bad_files_are_refused_from_their_headers_before_the_weights_load(tmp_path) -> None:
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(b"GGUF" + os.urandom(64))
    assert_one_clear_failure(run_cli("--lora", str(noise), "--port", "0"), str(noise))
    gemma = DEMO_DIR / "uppercase.gguf"  # a real adapter, for another model
    assert_one_clear_failure(run_cli("--lora", str(gemma), "--port", "0"), "architecture")
    model = run_cli("-m", str(noise), "--port", "0")
    assert_one_clear_failure(model, "cannot use the model", str(noise))


def test_a_bad_lora_on_the_default_model_is_one_line_before_it_loads(tmp_path) -> None:
    """Without `-m` (the default model), a `--lora` that is missing is refused before the
    model loads, in one line, exit 1 (it was reported twice, after the load, exit 0)."""
    missing = tmp_path / "missing.gguf"
    cmd = [sys.executable, "-m", "loraserve.cli", "-t", "1", "--port", "0", "--lora", str(missing)]
    done = subprocess.run(cmd, capture_output=True, timeout=120, text=True)
    assert_one_clear_failure(done, str(missing), "no such adapter")


def test_ctrl_c_says_what_it_waits_for_and_a_second_one_exits_at_once() -> None:
    proc, url = start_process(["-np", "1", "-c", "8192", "--temp", "0"])
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, b"")))
    reader.start()
    started = threading.Event()

    def stream() -> None:
        body = {"prompt": "the", "n_predict": 8000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/completion", json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    started.set()
        except httpx.TransportError:
            pass

    client = threading.Thread(target=stream)
    try:
        client.start()
        assert started.wait(30)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while not any(b"shutting down" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, lines
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 128 + signal.SIGINT
        reader.join(10)
        client.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = b"".join(lines).decode()
    (note,) = [line for line in text.splitlines() if "shutting down" in line]
    assert "1 requests in flight" in note and "Ctrl-C again" in note
    assert "second SIGINT: exiting now" in text
    assert "Traceback" not in text and "CancelledError" not in text, text


def test_progress_while_loading_and_one_log_line_per_request(monkeypatch, caplog) -> None:
    monkeypatch.setattr(startup, "PROGRESS_EVERY_S", 0.02)
    gate = threading.Event()

    def slow_loader():
        assert gate.wait(30)
        return tiny_model()

    with caplog.at_level(logging.INFO, logger="loraserve"):
        with serve_in_thread(["-np", "2", "-c", "256"], loader=slow_loader, wait_ready=False) as s:
            deadline = time.monotonic() + 20
            while not any("still preparing the model" in m for m in caplog.messages):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            gate.set()
            while s.client.get("/health").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            body = {"prompt": "the cat", "n_predict": 3, "ignore_eos": True}
            first = s.client.post("/completion", json=body).json()
            s.client.post("/completion", json=body)
    lines = [m for m in caplog.messages if m.startswith("request ")]
    assert len(lines) == 2, caplog.messages
    n = first["tokens_evaluated"]
    assert (
        f"slot {first['id_slot']} mix [base]: prompt {n} tokens (0 cached, {n} evaluated"
        in lines[0]
    )
    assert "generated 3 tokens" in lines[0] and "tok/s" in lines[0] and "stop limit" in lines[0]
    assert f"({n - 1} cached, 1 evaluated" in lines[1]
