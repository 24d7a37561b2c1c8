"""Start-up and shutdown: 503 while the model loads (or after it failed to), and a graceful
SIGTERM in a real server process (in-flight requests finish, exit status 0)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.server_util import free_socket, serve_in_thread, tiny_model, tiny_model_path

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


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


def _start_process(args: list[str]) -> tuple[subprocess.Popen, str]:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    cmd = [sys.executable, "-m", "loraserve.cli", "-m", str(tiny_model_path())]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), "-t", "1", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "server process did not become healthy"
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def test_sigterm_finishes_in_flight_requests_and_exits_0() -> None:
    proc, url = _start_process(["-np", "2", "-c", "512", "--temp", "0"])
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


def test_missing_model_exits_1() -> None:
    cmd = [sys.executable, "-m", "loraserve.cli", "-m", "/nonexistent/model.gguf", "--port", "0"]
    done = subprocess.run(cmd, capture_output=True, timeout=60)
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    assert b"model not found" in done.stderr
