"""Adapter endpoints: load/unload from `--lora-dir` only (at scale 0 unless given, names
unique), global scales, `lora` on requests, `model` naming an adapter (case ignored; other
names served by the base model with one warning, or a 404 with --strict-model-names), unload
waiting for the requests that use it, `--lora` flags.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from loraserve.server.errors import ApiError
from loraserve.server.native.lora_api import resolve_adapter_path
from tests.server_util import peft_folder, serve_in_thread


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("loras")
    peft_folder(d / "up", 1)
    peft_folder(d / "down", 2)
    (d / "noise.gguf").write_bytes(os.urandom(256))
    (d / "empty").mkdir()
    os.symlink("/etc", d / "etc-link")
    os.mkfifo(d / "fifo.gguf")
    return d


def test_adapter_paths_stay_inside_the_allowed_directories(lora_dir, tmp_path) -> None:
    dirs = (os.path.realpath(lora_dir),)
    assert resolve_adapter_path(dirs, "up") == os.path.join(dirs[0], "up")
    assert resolve_adapter_path(dirs, str(lora_dir / "up")) == os.path.join(dirs[0], "up")
    cases = {
        "../up": 403,
        "/etc/hostname": 403,
        "etc-link/hostname": 403,
        "up/../../x": 403,
        "fifo.gguf": 400,
        "empty": 400,
        "missing.gguf": 404,
        "bad\x00name": 400,
    }
    for path, status in cases.items():
        with pytest.raises(ApiError) as e:
            resolve_adapter_path(dirs, path)
        assert e.value.status == status, path
    outside = peft_folder(tmp_path / "outside", 3)
    os.symlink(
        outside / "adapter_model.safetensors", lora_dir / "empty" / "adapter_model.safetensors"
    )
    (lora_dir / "empty" / "adapter_config.json").write_text("{}")
    with pytest.raises(ApiError) as e:
        resolve_adapter_path(dirs, "empty")
    assert e.value.status == 403


@pytest.fixture(scope="module")
def srv(lora_dir):
    args = ["-np", "1", "-c", "256", "--temp", "0", "--lora-dir", str(lora_dir)]
    with serve_in_thread(args) as s:
        yield s


def complete(srv, expect: int = 200, **kw) -> dict:
    body = {"prompt": "the cat and the", "n_predict": 8, "ignore_eos": True, **kw}
    r = srv.client.post("/completion", json=body)
    assert r.status_code == expect, r.text
    return r.json()


def load(srv, path: str, expect: int = 200, **kw) -> dict:
    r = srv.client.post("/lora-adapters/load", json={"path": path, **kw})
    assert r.status_code == expect, r.text
    return r.json()


def test_load_set_global_and_request_lora(srv) -> None:
    base = complete(srv, cache_prompt=False)["content"]
    up = load(srv, "up", scale=1.0)
    assert {"id", "name", "path", "scale"} <= up.keys() and up["scale"] == 1.0
    listed = srv.client.get("/lora-adapters").json()
    assert {"id": up["id"], "scale": 1.0, "name": "up"}.items() <= listed[-1].items()
    under_global = complete(srv)
    assert under_global["generation_settings"]["lora"] == [{"id": up["id"], "scale": 1.0}]
    assert under_global["content"] != base
    assert srv.client.post("/lora-adapters", json=[]).json() == {"success": True}
    off = complete(srv)
    assert off["generation_settings"]["lora"] == [] and off["content"] == base
    explicit = complete(srv, lora=[{"id": up["id"], "scale": 1.0}])
    assert explicit["content"] == under_global["content"]
    zero = complete(srv, lora=[{"id": up["id"], "scale": 0.0}])
    assert zero["generation_settings"]["lora"] == [] and zero["content"] == base


def test_model_field_names_an_adapter(srv) -> None:
    adapters = {a["name"]: a["id"] for a in srv.client.get("/lora-adapters").json()}
    up = adapters.get("up") if "up" in adapters else load(srv, "up", scale=0.0)["id"]
    srv.client.post("/lora-adapters", json=[])
    body = {"prompt": "the cat and the", "max_tokens": 8, "ignore_eos": True}
    by_name = srv.client.post("/v1/completions", json={**body, "model": "up"}).json()
    by_id = complete(srv, lora=[{"id": up, "scale": 1.0}])
    assert by_name["choices"][0]["text"] == by_id["content"]
    assert srv.client.get("/slots").json()[0]["params"]["lora"] == [{"id": up, "scale": 1.0}]
    plain = srv.client.post("/v1/completions", json={**body, "model": "tiny.gguf"}).json()
    assert plain["choices"][0]["text"] == complete(srv)["content"]
    assert "up" in [m["id"] for m in srv.client.get("/v1/models").json()["data"]]


def test_model_names_are_case_insensitive_and_unknown_ones_served_by_the_base(srv, caplog) -> None:
    up = next((a for a in srv.client.get("/lora-adapters").json() if a["name"] == "up"), None)
    up_id = up["id"] if up else load(srv, "up")["id"]
    srv.client.post("/lora-adapters", json=[])
    body = {"prompt": "the cat and the", "max_tokens": 8, "ignore_eos": True}
    by_id = complete(srv, lora=[{"id": up_id, "scale": 1.0}])["content"]
    shouted = srv.client.post("/v1/completions", json={**body, "model": "UP"}).json()
    assert shouted["choices"][0]["text"] == by_id and shouted["model"] == "up"
    base = complete(srv)["content"]
    with caplog.at_level(logging.WARNING, logger="loraserve.server"):
        for _ in range(2):
            r = srv.client.post("/v1/completions", json={**body, "model": "gpt-4o"}).json()
            assert r["choices"][0]["text"] == base and r["model"] == "tiny.gguf"
        r = srv.client.post("/v1/completions", json={**body, "model": "TINY.gguf"}).json()
        assert r["choices"][0]["text"] == base
    warned = [m for m in caplog.messages if "names neither the model nor" in m]
    assert len(warned) == 1 and "gpt-4o" in warned[0]  # once per name; the model's own: none


def test_strict_model_names(lora_dir) -> None:
    args = ["-np", "1", "-c", "256", "--lora", str(lora_dir / "up"), "--strict-model-names"]
    with serve_in_thread(args) as s:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = s.client.post("/v1/chat/completions", json={**body, "model": "nope"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert "'nope'" in r.json()["error"]["message"] and "'up'" in r.json()["error"]["message"]
        for name in ("Up", "tiny.gguf"):
            r = s.client.post("/v1/chat/completions", json={**body, "model": name})
            assert r.status_code == 200, r.text
        assert not any(x["is_processing"] for x in s.client.get("/slots").json())


def test_run_time_loads_start_at_scale_0_with_unique_names(srv) -> None:
    srv.client.post("/lora-adapters", json=[])
    base = complete(srv, cache_prompt=False)["content"]
    first = load(srv, "down")
    second = load(srv, "down")
    assert first["scale"] == second["scale"] == 0.0
    assert first["name"].startswith("down") and second["name"] == f"{first['name']}-2"
    assert complete(srv)["content"] == base  # default requests keep their answers
    taken = load(srv, "down", 400, name="DOWN-2")
    assert "already loaded" in taken["error"]["message"]
    named = load(srv, "down", name="down-special", scale=0.5)
    listed = {a["name"]: a["scale"] for a in srv.client.get("/lora-adapters").json()}
    assert listed["down-special"] == 0.5 and listed[second["name"]] == 0.0
    for a in (first, second, named):
        assert srv.client.post("/lora-adapters/unload", json={"id": a["id"]}).status_code == 200


def test_load_refusals(srv) -> None:
    assert load(srv, "/etc/hostname", 403)["error"]["type"] == "permission_error"
    assert load(srv, "../x", 403)["error"]["type"] == "permission_error"
    assert load(srv, "fifo.gguf", 400)["error"]["type"] == "invalid_request_error"
    assert load(srv, "nothing-here", 404)["error"]["type"] == "not_found_error"
    assert load(srv, "noise.gguf", 400)["error"]["type"] == "invalid_request_error"
    assert load(srv, "up", 400, scale="x")["error"]["type"] == "invalid_request_error"
    assert srv.client.get("/health").status_code == 200


def test_unload_waits_for_running_requests(srv) -> None:
    down = load(srv, "down", scale=0.0)["id"]
    lora = [{"id": down, "scale": 1.0}]
    ref = complete(srv, lora=lora, n_predict=120, cache_prompt=False)["content"]
    result: dict = {}
    t = threading.Thread(
        target=lambda: result.update(complete(srv, lora=lora, n_predict=120, cache_prompt=False))
    )
    t.start()
    while not any(s["is_processing"] for s in srv.client.get("/slots").json()):
        if not t.is_alive():
            break
    r = srv.client.post("/lora-adapters/unload", json={"id": down})
    assert r.status_code == 200 and r.json() == {"success": True}
    t.join()
    assert result["content"] == ref
    assert down not in [a["id"] for a in srv.client.get("/lora-adapters").json()]
    err = complete(srv, 400, lora=lora)["error"]
    assert err["type"] == "invalid_request_error" and str(down) in err["message"]
    r = srv.client.post("/lora-adapters/unload", json={"id": down})
    assert r.status_code == 400


@pytest.mark.parametrize("init_off", [False, True])
def test_lora_flags_at_start(lora_dir, init_off) -> None:
    args = ["-np", "1", "-c", "256", "--lora-scaled", f"{lora_dir / 'up'}:0.5"]
    try:
        with serve_in_thread(args + (["--lora-init-without-apply"] if init_off else [])) as s:
            (a,) = s.client.get("/lora-adapters").json()
            assert a["id"] == 0 and a["scale"] == (0.0 if init_off else 0.5)
    except RuntimeError as e:
        if "not available" not in str(e):
            raise
        pytest.skip("the engine has no adapter registry yet")
