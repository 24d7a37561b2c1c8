"""SIGTERM with requests that cannot finish within the grace period: the server stops
accepting at once, cancels what is still running when the grace period ends (a plain request
answers 503 `unavailable_error`, a stream ends with that error event), and exits 0.
(`tests/http/test_lifecycle.py` covers requests that do finish within it.)"""

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

from tests.server_util import free_socket, tiny_model_path

GRACE_S = 1.0
SHUTTING_DOWN = {"code": 503, "message": "the server is shutting down", "type": "unavailable_error"}
LAUNCH = (
    "import sys, loraserve.server.app as app; app.SHUTDOWN_GRACE_S = {grace}; "
    "from loraserve.cli import main; main(sys.argv[1:])"
)


def start(args: list[str]) -> tuple[subprocess.Popen, str]:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    code = LAUNCH.format(grace=GRACE_S)
    cmd = [sys.executable, "-c", code, "-m", str(tiny_model_path()), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [*cmd, "-t", "1", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
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


def test_sigterm_cancels_what_outlasts_the_grace_period_and_exits_0() -> None:
    proc, url = start(["-np", "2", "-c", "8192", "--temp", "0"])
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
