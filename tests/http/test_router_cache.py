"""The router lists llama-server's download cache (issue 30: its router lists the Hugging Face
hub cache, ids `ORG/NAME:TAG`; llama.cpp's router tests name their models so): which files
are models (first shards, tagged, no projectors or draft heads, the commit `refs/main`
names), where the cache is (llama-server's variables in its order), the models served by
that id over HTTP; and a plain `loraserve` keeps answering requests that name no model with
the default model when the cache lists others beside it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from loraserve.server.config.args import parse_server_args
from loraserve.server.router import app as router_app
from loraserve.server.router import hf_cache, presets
from tests.http.router_util import router
from tests.server_util import free_socket, tiny_model_path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLD = "fedcba9876543210fedcba9876543210fedcba98"


def repo(root: Path, repo_id: str, files: list[str], commit: str = COMMIT) -> Path:
    """A hub-cache repository folder whose `refs/main` snapshot holds `files` (tiny models)."""
    folder = root / ("models--" + repo_id.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit + "\n")
    for name in files:
        path = folder / "snapshots" / commit / name
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_model_path(), path)
    return folder


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hub"
    repo(root, "org/tiny-GGUF", ["tiny-Q8_0.gguf", "tiny.f16.gguf", "mmproj-tiny-F16.gguf"])
    repo(root, "org/split-GGUF", [f"q4/big-Q4_K_M-0000{i}-of-00002.gguf" for i in (1, 2)])
    repo(root, "org/drafts", ["mtp-x-Q8_0.gguf", "notag.gguf", "x-Q2_K.bin"])
    stale = repo(root, "org/stale", ["s-Q8_0.gguf"], commit=OLD)
    (stale / "refs" / "main").write_text("not-a-commit\n")  # no valid ref: skipped
    repo(root, "bad--name--x", ["b-Q8_0.gguf"])  # two slashes: not a repository id
    (root / "models--org--noref" / "snapshots").mkdir(parents=True)
    monkeypatch.setenv("LLAMA_CACHE", str(root))
    closed = free_socket()  # a hub that cannot be reached: `-hf` falls back to the cache
    monkeypatch.setenv("MODEL_ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}/")
    closed.close()
    return root


def test_which_files_are_models(cache: Path) -> None:
    snap = f"snapshots/{COMMIT}"
    assert hf_cache.cached_models() == {
        "org/split-GGUF:Q4_K_M": str(
            cache / "models--org--split-GGUF" / snap / "q4/big-Q4_K_M-00001-of-00002.gguf"
        ),
        "org/tiny-GGUF:F16": str(cache / "models--org--tiny-GGUF" / snap / "tiny.f16.gguf"),
        "org/tiny-GGUF:Q8_0": str(cache / "models--org--tiny-GGUF" / snap / "tiny-Q8_0.gguf"),
    }


def test_the_cache_folder_follows_llama_servers_variables(monkeypatch, tmp_path: Path) -> None:
    order = ["LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"]
    for var in order:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_cache.cache_dir() == tmp_path / ".cache/huggingface/hub"
    expected = {
        "XDG_CACHE_HOME": tmp_path / "x/huggingface/hub",
        "HF_HOME": tmp_path / "x/hub",
        "HUGGINGFACE_HUB_CACHE": tmp_path / "x",
        "HF_HUB_CACHE": tmp_path / "x",
        "LLAMA_CACHE": tmp_path / "x",
    }
    for var in reversed(order):  # each one set wins over those set before it
        monkeypatch.setenv(var, str(tmp_path / "x"))
        assert hf_cache.cache_dir() == expected[var], var


def test_cached_models_are_served_by_their_id(cache: Path) -> None:
    with router(["--models-max", "1", "-c", "256"]) as (c, _):
        listed = {m["id"]: m for m in c.get("/models").json()["data"]}
        ids = {i for i, m in listed.items() if m["source"] == "cache"}
        assert {"org/tiny-GGUF:Q8_0", "org/tiny-GGUF:F16", "org/split-GGUF:Q4_K_M"} <= ids
        body = {"model": "org/tiny-GGUF:Q8_0", "prompt": "hi", "n_predict": 2}
        r = c.post("/completion", json=body)
        assert r.status_code == 200 and r.json()["model"] == "org/tiny-GGUF:Q8_0", r.text
        status = {m["id"]: m["status"]["value"] for m in c.get("/models").json()["data"]}
        assert status["org/tiny-GGUF:Q8_0"] == "loaded"


def test_nameless_requests_on_a_plain_start(cache: Path, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(router_app, "default_model_entry", lambda: ("dflt", "/m/dflt.gguf"))
    monkeypatch.setattr(presets, "default_model_entry", lambda: ("dflt", "/m/dflt.gguf"))
    plain = router_app.Router(parse_server_args([]))
    assert len(plain.catalog) > 1 and plain.implicit() == "dflt"
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(tiny_model_path(), folder / "a.gguf")
    given = router_app.Router(parse_server_args(["--models-dir", str(folder)]))
    assert given.implicit() == ""  # llama-server's 400: several models, none named
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(presets, "default_model_entry", lambda: None)
    monkeypatch.setattr(router_app, "default_model_entry", lambda: None)
    assert router_app.Router(parse_server_args(["--models-dir", str(folder)])).implicit() == "a"


def test_tests_never_read_the_machines_cache() -> None:
    """tests/conftest.py points the cache at an empty folder, so the router tests' model
    lists do not depend on what this machine has downloaded."""
    assert hf_cache.cached_models() == {}
    assert "LLAMA_CACHE" in os.environ


def test_hf_repo_resolves_in_the_cache_as_llama_server_offline(cache: Path) -> None:
    tiny = cache / "models--org--tiny-GGUF" / "snapshots" / COMMIT
    assert hf_cache.resolve("org/tiny-GGUF:q8_0") == str(tiny / "tiny-Q8_0.gguf")
    assert hf_cache.resolve("org/tiny-GGUF:F16") == str(tiny / "tiny.f16.gguf")
    assert hf_cache.resolve("org/tiny-GGUF") == str(tiny / "tiny-Q8_0.gguf")  # Q4_K_M, Q8_0
    assert hf_cache.resolve("org/tiny-GGUF", "tiny.f16.gguf") == str(tiny / "tiny.f16.gguf")
    split = cache / "models--org--split-GGUF" / "snapshots" / COMMIT / "q4"
    assert hf_cache.resolve("org/split-GGUF") == str(split / "big-Q4_K_M-00001-of-00002.gguf")
    for missing in ("org/tiny-GGUF:Q2_K", "org/none", "org/stale:Q8_0"):
        assert hf_cache.resolve(missing) is None, missing
    assert parse_server_args(["-hf", "org/tiny-GGUF:F16"]).model == str(tiny / "tiny.f16.gguf")
    assert not parse_server_args(["-hf", "org/tiny-GGUF:F16"]).router


def test_dedup_cache_models_hides_the_entries_presets_serve(cache: Path, tmp_path: Path) -> None:
    ini = tmp_path / "p.ini"
    for text in (
        "[p]\nhf-repo = org/tiny-GGUF:Q8_0\ndedup-cache-models = 1\n",
        "[*]\ndedup-cache-models = true\n[p]\nhf = org/split-GGUF\nhfd = org/tiny-GGUF:Q8_0\n",
    ):
        ini.write_text(text)
        catalog = presets.load_catalog(parse_server_args(["--models-preset", str(ini)]))
        listed = {n for n, p in catalog.items() if p.listed}
        assert "org/tiny-GGUF:Q8_0" in catalog and "org/tiny-GGUF:Q8_0" not in listed, text
        assert {"p", "org/tiny-GGUF:F16"} <= listed and catalog["p"].error is None, text
    hidden_split = "org/split-GGUF:Q4_K_M" not in listed
    assert hidden_split  # the second preset's model is hidden too
    ini.write_text("[p]\nhf-repo = org/tiny-GGUF:Q8_0\n")
    catalog = presets.load_catalog(parse_server_args(["--models-preset", str(ini)]))
    assert all(p.listed for p in catalog.values())
    with router(["--models-preset", str(ini)]) as (c, _):
        ini.write_text("[p]\nhf-repo = org/tiny-GGUF:Q8_0\ndedup-cache-models = 1\n")
        ids = {m["id"] for m in c.get("/models?reload=1").json()["data"]}
        assert "p" in ids and "org/tiny-GGUF:Q8_0" not in ids
        body = {"model": "org/tiny-GGUF:Q8_0", "content": "hi"}  # hidden, still served
        assert c.post("/tokenize", json=body).status_code == 200


def test_download_and_delete_load_nothing(cache: Path) -> None:
    """llama-server's `POST /models` (download) and `DELETE /models` (remove the files) are the
    router's own routes: the model they name is never forwarded to, nor loaded (they were
    once, and autoloaded it); a hub that cannot be reached is a 503, not a 500."""
    with router(["-c", "256"]) as (c, state):
        name = "org/tiny-GGUF:Q8_0"
        path = Path(hf_cache.cached_models()[name])
        for r, code, message in (
            (c.post("/models", json={"model": name}), 400, f"model '{name}' already exists"),
            (c.post("/models", json={"model": "org/new:Q8_0"}), 503, "cannot download model"),
            (c.post("/models", json={}), 400, "model must be a non-empty string"),
            (c.delete("/models", params={"model": "org/none:Q8_0"}), 404, "not found"),
            (c.delete("/models", params={"model": name}), 200, ""),
        ):
            assert r.status_code == code and message in r.text, r.text
        assert not any(e.running for e in state.pool.engines.values())
        assert not path.exists() and name not in hf_cache.cached_models()
        assert "org/tiny-GGUF:F16" in hf_cache.cached_models()  # the other tag stays
