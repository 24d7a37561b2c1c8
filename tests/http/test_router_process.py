"""The router process itself never imports torch (issue 30): its engines run in child
processes (`router.host`), so the router is the HTTP front, the catalogue and the pool only.
With torch imported it held ~250 MiB more and started in seconds instead of a fraction of
one. Checked on a real `loraserve` process (no `-m`): torch's library is not mapped after
start, nor after a request has loaded a model and been answered through the router (the
answer comes from the engine's child process), and the router's own RSS stays small."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.server_util import free_socket, tiny_model_path

ROUTER_RSS_MAX_MIB = 150  # the router alone: ~60 MiB measured; with torch it was ~300


def _mapped(pid: int, name: str) -> bool:
    return name in Path(f"/proc/{pid}/maps").read_text()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_the_router_process_never_imports_torch(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(tiny_model_path(), models / "tiny.gguf")
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "loraserve.cli", "--models-dir", str(models), "-t", "1"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the router did not become healthy"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        assert not _mapped(proc.pid, "libtorch"), "the router process imported torch"
        body = {"model": "tiny", "prompt": "the cat", "n_predict": 4, "temperature": 0}
        r = httpx.post(f"{url}/completion", json=body, timeout=300)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "tiny"
        assert not _mapped(proc.pid, "libtorch"), "serving a model imported torch in the router"
        assert _rss_mib(proc.pid) < ROUTER_RSS_MAX_MIB
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
