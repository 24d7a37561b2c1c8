"""Presets whose `hf-repo` is not in the download cache (issue 30): listed without a download,
downloaded when first loaded (`POST /models/load` or a request naming the preset), as
llama-server's child downloads its `-hf` model at its start, then served. The hub is the
suite's local stand-in (`scripts/llama_suite_hub.py`); the cache is checked with
`huggingface_hub.scan_cache_dir`, an independent reader of its layout, and the answers against
a router over the same file as a `--models-dir` model. A hub that cannot be reached, that
never answers, or that has no such repository is a 503 / 404 naming it and the preset's
`failed` status in `GET /models`, never a 500 or a hang."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.http.hub_util import Events, ids
from tests.http.hub_util import hub as hub  # a fixture
from tests.http.router_util import router, status, wait_status
from tests.server_util import free_socket

INI = """\
[p1]
hf-repo = org/dl:F16
ctx-size = 256

[p2]
hf-repo = org/dl:Q8_0
c = 256

[gone]
hf-repo = org/missing:Q8_0
c = 256
"""
BODY = {"prompt": "hello world, the router", "n_predict": 4, "temperature": 0}


def presets(tmp_path: Path) -> Path:
    path = tmp_path / "presets.ini"
    path.write_text(INI)
    return path


def snapshot_files(cache: Path) -> dict[str, list[str]]:
    import huggingface_hub

    info = huggingface_hub.scan_cache_dir(cache)
    assert not info.warnings, info.warnings
    return {
        r.repo_id: sorted(f.file_name for v in r.revisions for f in v.files) for r in info.repos
    }


def test_a_preset_downloads_its_model_when_loaded(hub: dict, tmp_path: Path) -> None:
    with router(["--models-preset", str(presets(tmp_path))]) as (c, _):
        listed = ids(c)
        assert listed["p1"]["status"] == {
            "value": "unloaded",
            "args": ["loraserve", "--hf-repo", "org/dl:F16", "--ctx-size", "256"],
            "preset": "hf-repo = org/dl:F16\nctx-size = 256\n",
        }  # listing downloads nothing, and it is no failure
        assert not hub["cache"].exists()
        events = Events(c)
        assert c.post("/models/load", json={"model": "p1"}).json() == {"success": True}
        wait_status(c, "p1", "loaded")
        seen = [e["event"] for e in events.wait("download_finished", "p1")]
        assert seen[0] == "status_change" and "download_progress" in seen
        assert snapshot_files(hub["cache"]) == {"org/dl": ["dl-F16.gguf"]}
        r = c.post("/completion", json={"model": "p1", **BODY})
        assert r.status_code == 200 and r.json()["model"] == "p1", r.text
        first = r.json()["content"]
        # two requests for p2 at once: one download, both answered by its engine
        answers: list[httpx.Response] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(c.post("/completion", json={"model": "p2", **BODY}))
            )
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        assert (
            events.wait("download_finished", "p2").count(
                {"model": "p2", "event": "download_finished"}
            )
            == 1
        )
        assert snapshot_files(hub["cache"]) == {"org/dl": ["dl-F16.gguf", "dl-Q8_0.gguf"]}
        assert len(list((hub["cache"] / "models--org--dl" / "blobs").iterdir())) == 1
        assert status(c, "p2")["value"] == "loaded"
    folder = tmp_path / "models"  # the same file, as a local model: the same answer
    folder.mkdir()
    (folder / "same.gguf").symlink_to(hub["model"])
    with router(["--models-dir", str(folder), "-c", "256"]) as (c, _):
        r = c.post("/completion", json={"model": "same", **BODY})
        assert r.status_code == 200 and r.json()["content"] == first


def test_unreachable_or_missing_hub_is_named_never_500(
    hub: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with router(["--models-preset", str(presets(tmp_path))]) as (c, state):
        r = c.post("/models/load", json={"model": "gone"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
        assert "cannot download model 'gone' (org/missing:Q8_0)" in r.json()["error"]["message"]
        assert status(c, "gone")["failed"] and "org/missing" in status(c, "gone")["error"]
        r = c.post("/completion", json={"model": "gone", **BODY})
        assert r.status_code == 404, r.text
        r = c.post("/completion?autoload=false", json={"model": "p1", **BODY})
        assert r.status_code == 400 and r.json()["error"]["message"] == "model is not loaded"
        refused = f"http://127.0.0.1:{free_socket().getsockname()[1]}/"  # closed: refuses
        monkeypatch.setenv("MODEL_ENDPOINT", refused)
        t0 = time.monotonic()
        for call in (
            lambda: c.post("/models/load", json={"model": "p1"}),
            lambda: c.post("/completion", json={"model": "p1", **BODY}),
            lambda: c.post("/v1/chat/completions", json={"model": "p1", "messages": []}),
        ):
            r = call()
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] == "unavailable_error"
            assert refused in r.json()["error"]["message"]
        assert time.monotonic() - t0 < 30
        s = status(c, "p1")
        assert s["value"] == "unloaded" and s["failed"] and s["exit_code"] == 1
        assert refused in s["error"]
        assert c.get("/health", params={"model": "p1"}).status_code == 503
        from loraserve.server.router import download

        silent = socket.create_server(("127.0.0.1", 0))  # listens, never answers
        monkeypatch.setattr(download, "TIMEOUT_S", 0.5)
        monkeypatch.setenv("MODEL_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}/")
        try:
            r = c.post("/completion", json={"model": "p1", **BODY})
            assert r.status_code == 503 and "timed out" in r.text, r.text
        finally:
            silent.close()
        monkeypatch.setenv("MODEL_ENDPOINT", hub["url"])  # the hub is back: the next load works
        assert c.post("/models/load", json={"model": "p1"}).status_code == 200
        s = wait_status(c, "p1", "loaded")
        assert "failed" not in s
        assert sum(e.running for e in state.pool.engines.values()) == 1  # p1's alone


def test_offline_router_names_the_cache(hub: dict, tmp_path: Path) -> None:
    with router(["--models-preset", str(presets(tmp_path)), "--offline"]) as (c, _):
        s = status(c, "p1")
        assert s["failed"] and "is not in the download cache" in s["error"]
        assert str(hub["cache"]) in s["error"] and "--offline" in s["error"]
        c.post("/models/load", json={"model": "p1"})
        assert not hub["cache"].exists()


def test_unload_cancels_a_download_waiting_on_the_hub(
    hub: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`POST /models/unload` while the hub has not answered yet: no wait for its timeout,
    the request waiting for the preset gets a 503 saying so."""
    from loraserve.server.router import download

    silent = socket.create_server(("127.0.0.1", 0))  # listens, never answers
    monkeypatch.setattr(download, "TIMEOUT_S", 60.0)
    monkeypatch.setenv("MODEL_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}/")
    try:
        with router(["--models-preset", str(presets(tmp_path))]) as (c, _):
            answers: list[httpx.Response] = []
            waiter = threading.Thread(
                target=lambda: answers.append(c.post("/completion", json={"model": "p1", **BODY}))
            )
            waiter.start()
            wait_status(c, "p1", "loading")
            t0 = time.monotonic()
            assert c.post("/models/unload", json={"model": "p1"}).json() == {"success": True}
            waiter.join(30)
            assert time.monotonic() - t0 < 10
            (r,) = answers
            assert r.status_code == 503 and "was cancelled" in r.text, r.text
            assert status(c, "p1")["value"] == "unloaded"
    finally:
        silent.close()
