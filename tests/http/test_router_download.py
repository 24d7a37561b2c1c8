"""The router's downloads, as llama-server's (issue 30; llama.cpp's `test_router_download_model`,
`test_router_delete_model`, `test_router_remote_preset`): `POST /models` fetches a model from
the hub into the download cache (its `/models/sse` events, listed by its id once done, taking
no `--models-max` place), `DELETE /models` deletes a cached model's files (unloading it first),
and `-hf` of a repository holding a `preset.ini` starts the router on those presets. The hub
is the suite's local stand-in (`scripts/llama_suite_hub.py`, llama.cpp's three requests); the
cache layout is checked with `huggingface_hub.scan_cache_dir`, an independent reader of it.
Every bad input is a 4xx or a 503 that names the problem, never a 500."""

from __future__ import annotations

import hashlib
import shutil
import sys
import time
from pathlib import Path

import pytest

from loraserve.server.config.args import parse_server_args
from tests.http.hub_util import PRESETS, Events, ids
from tests.http.hub_util import hub as hub  # a fixture
from tests.http.router_util import router, status, wait_status
from tests.server_util import free_socket

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from llama_suite_hub import COMMIT, serve  # noqa: E402


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_lists_the_model_and_keeps_the_loaded_one(hub: dict, tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(hub["model"], folder / "local.gguf")
    with router(["--models-dir", str(folder), "--models-max", "1", "-c", "256"]) as (c, _):
        assert c.post("/models/load", json={"model": "local"}).json() == {"success": True}
        wait_status(c, "local", "loaded")
        events = Events(c)
        r = c.post("/models", json={"model": "org/dl:F16"})
        assert r.status_code == 200 and r.json() == {"success": True}, r.text
        seen = events.wait("download_finished", "org/dl:F16")
        kinds = [e["event"] for e in seen]
        assert kinds[0] == "model_status" and seen[0]["data"] == {"status": "downloading"}
        assert kinds[-1] == "download_finished" and "data" not in seen[-1]
        last = [e for e in seen if e["event"] == "download_progress"][-1]["data"]["progress"]
        size = hub["model"].stat().st_size
        assert list(last.values()) == [{"done": size, "total": size}]
        assert next(iter(last)).endswith(f"org/dl/resolve/{COMMIT}/dl-F16.gguf")
        listed = ids(c)
        assert listed["org/dl:F16"]["source"] == "cache" and listed["org/dl:F16"]["can_remove"]
        assert "org/dl:Q8_0" not in listed  # only the tag's file was fetched
        assert not listed["local"]["can_remove"]  # --models-dir: not the cache's
        assert status(c, "local")["value"] == "loaded"  # a download takes no place
    import huggingface_hub

    info = huggingface_hub.scan_cache_dir(hub["cache"])
    (repo,) = info.repos
    assert repo.repo_id == "org/dl" and not info.warnings
    (rev,) = repo.revisions
    assert rev.commit_hash == COMMIT and [f.file_name for f in rev.files] == ["dl-F16.gguf"]
    assert sha(next(iter(rev.files)).blob_path) == sha(hub["model"])


def test_download_errors_are_named_and_load_nothing(hub: dict, monkeypatch) -> None:
    with router(["-c", "256"]) as (c, state):
        c.post("/models", json={"model": "org/dl:F16"})
        deadline = time.monotonic() + 60
        while "org/dl:F16" not in ids(c) or ids(c)["org/dl:F16"]["status"]["value"] != "unloaded":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for body, code, message in (
            ({}, 400, "model must be a non-empty string"),
            ({"model": 5}, 400, "model must be a non-empty string"),
            ({"model": "noslash"}, 400, "expected <user>/<model>[:quant]"),
            ({"model": "a/b/c"}, 400, "expected <user>/<model>[:quant]"),
            ({"model": "org/dl:F16"}, 400, "model 'org/dl:F16' already exists"),
            ({"model": "org/missing:Q8_0"}, 404, "cannot download model 'org/missing:Q8_0'"),
            ({"model": "org/dl:Q2_K"}, 404, "org/dl has no GGUF file with tag Q2_K"),
            ({"model": "org/presets"}, 400, "is a repository of presets"),
        ):
            r = c.post("/models", json=body)
            assert r.status_code == code and message in r.json()["error"]["message"], r.text
        r = c.post("/models", content=b"{not json")
        assert r.status_code == 400 and "malformed JSON" in r.text
        monkeypatch.setenv("MODEL_ENDPOINT", f"http://127.0.0.1:{free_socket().getsockname()[1]}")
        r = c.post("/models", json={"model": "org/other:Q8_0"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error", r.text
        assert not any(e.running for e in state.pool.engines.values())


def test_delete_removes_only_that_models_files(hub: dict, tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(hub["model"], folder / "local.gguf")
    outside = tmp_path / "outside.gguf"
    shutil.copy(hub["model"], outside)
    linked = hub["cache"] / "models--org--linked" / "snapshots" / COMMIT
    linked.mkdir(parents=True)
    (linked / "l-Q8_0.gguf").symlink_to(outside)  # a link out of the cache
    (linked.parents[1] / "refs").mkdir()
    (linked.parents[1] / "refs" / "main").write_text(COMMIT)
    with router(["--models-dir", str(folder), "-c", "256"]) as (c, _):
        events = Events(c)
        for name in ("org/dl:F16", "org/dl:Q8_0"):
            assert c.post("/models", json={"model": name}).status_code == 200
            events.wait("download_finished", name)
        assert c.post("/models/load", json={"model": "org/dl:F16"}).status_code == 200
        wait_status(c, "org/dl:F16", "loaded")
        r = c.delete("/models", params={"model": "org/dl:F16"})
        assert r.status_code == 200 and r.json() == {"success": True}, r.text
        assert events.wait("model_remove", "org/dl:F16")[-1] == {
            "model": "org/dl:F16",
            "event": "model_remove",
        }
        listed = ids(c)
        assert "org/dl:F16" not in listed and "org/dl:Q8_0" in listed
        snap = hub["cache"] / "models--org--dl" / "snapshots" / COMMIT
        assert not (snap / "dl-F16.gguf").exists() and (snap / "q8/dl-Q8_0.gguf").is_file()
        blobs = list((hub["cache"] / "models--org--dl" / "blobs").iterdir())
        assert len(blobs) == 1  # the two tags' bytes are one blob, still used by Q8_0
        body = {"model": "org/dl:Q8_0", "prompt": "hi", "n_predict": 2}
        assert c.post("/completion", json=body).status_code == 200
        assert c.delete("/models", params={"model": "org/dl:Q8_0"}).status_code == 200
        assert not list((hub["cache"] / "models--org--dl" / "blobs").iterdir())
        assert c.delete("/models", params={"model": "org/linked:Q8_0"}).status_code == 200
        assert outside.is_file() and not (linked / "l-Q8_0.gguf").exists()
        for params, code, message in (
            ({"model": "org/dl:F16"}, 404, "model 'org/dl:F16' not found"),
            ({"model": "local"}, 400, "is not removable (not from the download cache)"),
            ({}, 400, "model must be a non-empty string"),
        ):
            r = c.delete("/models", params=params)
            assert r.status_code == code and message in r.json()["error"]["message"], r.text
        assert (folder / "local.gguf").is_file()


def test_hf_preset_repository_starts_the_router(hub: dict) -> None:
    with pytest.raises(SystemExit):  # nothing cached yet, and offline
        parse_server_args(["-hf", "org/presets", "--offline"])
    for name in ("org/dl:F16", "org/dl:Q8_0"):  # the presets' models, as -hf downloads them
        cfg = parse_server_args(["-hf", name])
        assert not cfg.router and sha(Path(cfg.model)) == sha(hub["model"])
    cfg = parse_server_args(["-hf", "org/presets"])
    assert cfg.router and Path(cfg.models_preset).read_text() == PRESETS
    assert parse_server_args(["-hf", "org/presets", "--offline"]).models_preset == cfg.models_preset
    with router(["-hf", "org/presets"]) as (c, _):
        listed = ids(c)
        assert {"p1", "p2"} <= set(listed) and listed["p1"]["source"] == "preset"
        assert not listed["p1"]["can_remove"]
        assert c.post("/models/load", json={"model": "p1"}).json() == {"success": True}
        wait_status(c, "p1", "loaded")
        r = c.post("/completion", json={"model": "p1", "prompt": "hi", "n_predict": 2})
        assert r.status_code == 200 and r.json()["model"] == "p1", r.text


def test_a_cancelled_download_leaves_nothing(hub: dict, tmp_path: Path, monkeypatch) -> None:
    """`fetch` checks its cancel between chunks: no partial file, no snapshot entry, no
    ref (a `DELETE /models` or `/models/unload` of a download, or the router's shutdown)."""
    from loraserve.server.router import download

    big = tmp_path / "big-Q8_0.gguf"
    big.write_bytes(b"GGUF" + bytes(3 * download.CHUNK))
    server, url = serve({"org/big": {"big-Q8_0.gguf": big}})
    try:
        monkeypatch.setenv("MODEL_ENDPOINT", url)
        p = download.plan("org/big:Q8_0")
        seen: list[tuple[int, int]] = []
        with pytest.raises(download.Cancelled):
            download.fetch(p, lambda u, d, t: seen.append((d, t)), lambda: bool(seen))
        assert seen == [(0, big.stat().st_size)]
        assert not [f for f in p.folder.rglob("*") if f.is_file()]
        assert download.fetch(p) == p.final(p.files[0])  # then a whole one
        assert sha(p.final(p.files[0])) == sha(big)
    finally:
        server.shutdown()
