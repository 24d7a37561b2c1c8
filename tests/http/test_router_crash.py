"""A crash of one engine never takes the router down (issue 30 item 2): engines run in a child
process per base file, so a native crash (a segfault or abort in a kernel, simulated here by
the signal itself) ends that process alone. The router keeps answering, the other base's
engine keeps serving the same answers, the crashed model reads `unloaded` with `failed`,
and its next request loads it again in a new process, answering as before."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.http.router_util import PROMPT, complete, router, status, wait_status
from tests.server_util import tiny_model_path
from tests.tiny import hf_model, write_gguf


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("crash-models")
    shutil.copy(tiny_model_path(), d / "tiny.gguf")
    write_gguf(d / "other.gguf", hf_model("llama", seed=11), "llama")
    return d


def pid_of(state: object, name: str) -> int:
    eng = state.pool.engines[state.find(name).key]  # type: ignore[attr-defined]
    assert eng.host is not None
    return eng.host.pid


def wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat") as f:  # a zombie until the router reaps it
            if f.read().split(") ", 1)[1].startswith("Z"):
                return
        assert time.monotonic() < deadline, "the process did not end"
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT])
def test_an_engine_crash_leaves_the_router_and_other_models_serving(
    models_dir: Path, sig: signal.Signals
) -> None:
    with router(["--models-dir", str(models_dir), "-c", "256", "-np", "2"]) as (c, state):
        before = {n: complete(c, n, n_predict=6).json()["content"] for n in ("tiny", "other")}
        victim, survivor = pid_of(state, "tiny"), pid_of(state, "other")
        assert victim != survivor and victim != os.getpid()
        # a request in flight on the victim when it dies: answered (an error or a cut
        # stream), never a hang, and the router goes on
        got: list = []

        def stream() -> None:
            body = {"model": "tiny", "prompt": "x", "n_predict": 200, "stream": True}
            try:
                with c.stream("POST", "/completion", json=body, timeout=60) as r:
                    got.append(r.status_code)
                    for _ in r.iter_bytes():
                        pass
            except httpx.HTTPError as e:
                got.append(type(e).__name__)
            got.append("end")

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        os.kill(victim, sig)
        wait_dead(victim)
        t.join(60)
        assert got and got[-1] == "end"
        assert c.get("/health").json() == {"status": "ok"}
        crashed = wait_status(c, "tiny", "unloaded")
        assert crashed["failed"] is True and crashed["exit_code"] == 1
        assert signal.Signals(sig).name in crashed["error"]
        assert status(c, "other")["value"] == "loaded"
        assert complete(c, "other", n_predict=6).json()["content"] == before["other"]
        assert pid_of(state, "other") == survivor
        # the crashed model loads again on its next request, in a new process
        body = {"model": "tiny", "prompt": PROMPT, "n_predict": 6, "temperature": 0}
        again = c.post("/completion", json=body, timeout=300)  # a process start, on a busy CI
        assert again.status_code == 200 and again.json()["content"] == before["tiny"]
        assert pid_of(state, "tiny") not in (victim, survivor)
        assert wait_status(c, "tiny", "loaded").get("failed") is None


def test_hosts_end_with_their_models_and_the_router(models_dir: Path) -> None:
    """An unloaded base's process ends; the router's end ends every process it started."""
    with router(["--models-dir", str(models_dir), "-c", "256"]) as (c, state):
        assert complete(c, "tiny").status_code == 200
        pid = pid_of(state, "tiny")
        assert c.post("/models/unload", json={"model": "tiny"}).json() == {"success": True}
        wait_dead(pid)
        assert complete(c, "other").status_code == 200
        other = pid_of(state, "other")
        spare = state.pool.spare  # type: ignore[attr-defined]
        spare_pid = spare.result().pid if spare is not None and spare.done() else None
    wait_dead(other)
    if spare_pid is not None:
        wait_dead(spare_pid)


def test_a_stuck_engine_never_holds_the_router_up(models_dir: Path) -> None:
    """A host that stops answering (SIGSTOP: as a deadlock looks from outside) is killed at
    the router's end instead of being waited for, and the router's end still comes."""
    with router(["--models-dir", str(models_dir), "-c", "256"]) as (c, state):
        assert complete(c, "tiny").status_code == 200
        pid = pid_of(state, "tiny")
        os.kill(pid, signal.SIGSTOP)
    wait_dead(pid)  # `router` joins its server thread for 15 s at most


def _zombie_children() -> set[int]:
    """This process's children that ended and were never waited for."""
    out = set()
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().split(") ", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            out.add(int(p))
    return out


def test_the_routers_end_reaps_a_spare_still_starting(models_dir: Path) -> None:
    # a load takes the spare and starts the next one; the router ends at once, while that
    # spare is still starting: its process is ended and waited for, not left a zombie
    before = _zombie_children()
    with router(["--models-dir", str(models_dir)]) as (c, _):
        assert c.post("/models/load", json={"model": "tiny"}).json() == {"success": True}
        wait_status(c, "tiny", "loaded")
    # an unreaped spare ends once its imports are done and it reads its closed stdin
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not _zombie_children() - before:
        time.sleep(0.1)
    assert _zombie_children() - before == set()
