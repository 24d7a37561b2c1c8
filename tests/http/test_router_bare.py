"""A start without `-m` is a router, as llama-server's (issue 30; its README: "launch
`llama-server` without specifying any model"), and the README's one-command start keeps
working: the router lists the default model with its demo adapters at scale 0 (as a
single-model start loads them), and a request that names no model goes to the one model
when the router has only one (with more, llama-server's 400)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loraserve.adapters import DEMO_ADAPTERS, gguf_path
from loraserve.server.config.args import parse_server_args
from loraserve.server.router import presets
from tests.http.router_util import router_app
from tests.server_util import peft_folder, tiny_model_path
from tests.tiny import hf_model, write_gguf

BODY = {"prompt": "the cat", "n_predict": 6, "temperature": 0}


def test_no_model_flag_is_router_mode(tmp_path: Path) -> None:
    assert parse_server_args([]).router
    assert parse_server_args(["-c", "512", "--port", "9"]).router
    assert not parse_server_args(["-m", str(tmp_path / "x.gguf")]).router


def test_the_default_model_comes_with_its_demo_adapters_off(monkeypatch) -> None:
    monkeypatch.setattr(presets, "default_model_entry", lambda: ("dflt", "/m/dflt.gguf"))
    preset = presets.load_catalog(parse_server_args([]))["dflt"]
    demo = [(str(gguf_path(n)), 0.0) for n in DEMO_ADAPTERS]
    assert [(s.path, s.scale) for s in preset.lora] == [
        (Path(p).resolve().as_posix(), s) for p, s in demo
    ]
    assert "lora" not in preset.inject({"prompt": "x"})  # the engine's global scales apply
    own = presets.load_catalog(parse_server_args(["--lora", demo[0][0]]))["dflt"]
    assert [(s.path, s.scale) for s in own.lora] == [(demo[0][0], 1.0)]  # --lora's, no demo


def test_a_request_without_model_goes_to_the_only_model(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(presets, "default_model_entry", lambda: None)
    shutil.copy(tiny_model_path(), tmp_path / "tiny.gguf")
    with router_app(["--models-dir", str(tmp_path)]) as (c, _):
        named = c.post("/completion", json={**BODY, "model": "tiny"})
        bare = c.post("/completion", json=BODY)
        assert named.status_code == bare.status_code == 200, bare.text
        assert bare.json()["content"] == named.json()["content"]
        assert bare.json()["model"] == "tiny"
    write_gguf(tmp_path / "other.gguf", hf_model("llama", seed=11), "llama")
    with router_app(["--models-dir", str(tmp_path)]) as (c, _):
        r = c.post("/completion", json=BODY)
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "model name is missing from the request"


@pytest.mark.parametrize("flags", [[], ["--models-max", "1"]])
def test_props_say_router(flags: list[str], monkeypatch) -> None:
    monkeypatch.setattr(presets, "default_model_entry", lambda: None)
    with router_app(flags) as (c, _):
        assert c.get("/props").json()["role"] == "router"
        assert c.get("/models").json()["data"] == []


def test_global_adapter_scales_reach_requests_without_lora(tmp_path: Path, monkeypatch) -> None:
    """As the README's start says of the demo adapters: loaded at scale 0, switched on for
    requests without `lora` by `POST /lora-adapters` (no model named: the only one)."""
    monkeypatch.setattr(presets, "default_model_entry", lambda: None)
    shutil.copy(tiny_model_path(), tmp_path / "tiny.gguf")
    adapter = peft_folder(tmp_path / "adapter", 3, magnitude=2.0)
    flags = ["--models-dir", str(tmp_path), "--lora-scaled", f"{adapter}:0"]
    with router_app(flags) as (c, _):
        off = c.post("/completion", json=BODY).json()["content"]
        on = c.post("/completion", json={**BODY, "lora": [{"id": 0, "scale": 1}]}).json()
        assert on["content"] != off  # the adapter changes this answer
        assert c.post("/lora-adapters", json=[{"id": 0, "scale": 1}]).status_code == 200
        assert c.post("/completion", json=BODY).json()["content"] == on["content"]
