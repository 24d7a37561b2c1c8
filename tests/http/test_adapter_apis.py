"""The adapter API shapes users migrate from, beyond `test_adapter_catalogue`: vLLM's
`--lora-modules` (`name=path` and its JSON form, whose `base_model_name` is the model's
`parent` in `/v1/models`, as vLLM's `show_available_models`), first use by `model` on the
Anthropic and Responses APIs answering with the adapter, the same rules on every load
endpoint (API key, `--lora-dir` allow-list, no `--lora-dir`: loading off), and bad input as
a 4xx naming the problem, never a 500.

The oracle for an adapter's answer is the same adapter named in a `lora` entry (the engine's
maths are checked against PEFT in tests/unit/lora).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from loraserve.server.config.args import parse_server_args
from tests.server_util import peft_folder, serve_in_thread

PROMPT = "the cat and the"
KEY = {"Authorization": "Bearer k"}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A --lora-dir (``up``, ``down``, ``side``, a ``broken`` folder, a link loop) and a folder
    outside it (``mod``, ``jmod``)."""
    lib = tmp_path_factory.mktemp("lib")
    peft_folder(lib / "up", 1)
    peft_folder(lib / "down", 2)
    peft_folder(lib / "side", 4)  # named by the global scales alone
    os.symlink(lib / "loop.gguf", lib / "loop.gguf")  # a link to itself
    shutil.copytree(lib / "up", lib / "broken")
    (lib / "broken" / "adapter_model.safetensors").write_bytes(b"not safetensors")
    outside = tmp_path_factory.mktemp("outside")
    peft_folder(outside / "mod", 3)
    shutil.copytree(lib / "down", outside / "jmod")
    return lib, outside


@pytest.fixture(scope="module")
def srv(dirs):
    lib, outside = dirs
    module = json.dumps({"name": "JMod", "path": str(outside / "jmod"), "base_model_name": "b/x"})
    args = ["-np", "2", "-c", "512", "--temp", "0", "--lora-dir", str(lib), "--api-key", "k"]
    args += ["--lora-modules", f"mod={outside / 'mod'}", module]
    with serve_in_thread(args) as s:
        s.client.headers.update(KEY)
        yield s


def complete(srv, **kw) -> dict:
    body = {"prompt": PROMPT, "n_predict": 8, "ignore_eos": True, **kw}
    r = srv.client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def chat(srv, model: str | None) -> str:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    r = srv.client.post("/v1/chat/completions", json={**body, "model": model} if model else body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_lora_modules_are_served_by_name_and_listed(srv, dirs) -> None:
    _, outside = dirs
    base = complete(srv)["content"]
    body = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, "temperature": 0}
    for name, registered in (("mod", "mod"), ("jmod", "JMod")):
        by_model = srv.client.post("/v1/completions", json={**body, "model": name}).json()
        by_lora = complete(srv, lora=[{"name": name.upper(), "scale": 1.0}])["content"]
        assert by_model["choices"][0]["text"] == by_lora != base
        assert by_model["model"] == registered  # the name as the flag spells it
    models = {m["id"]: m for m in srv.client.get("/v1/models").json()["data"]}
    assert models["mod"]["root"] == str((outside / "mod").resolve())
    assert models["mod"]["parent"] == "tiny.gguf"  # no base_model_name: the served model
    assert models["JMod"]["parent"] == "b/x"  # vLLM's parent: the JSON form's base model
    assert models["up"]["parent"] == "tiny.gguf"


def test_lora_modules_flag_errors_name_the_problem(dirs, capsys) -> None:
    _, outside = dirs
    m = f"mod={outside / 'mod'}"
    cases = [
        (["--lora-modules", m, f"MOD={outside / 'jmod'}"], "a name is given twice"),
        (["--lora-modules", "x=/no/such/dir"], "no such adapter file or folder"),
        (["--lora-modules", "{nope"], "invalid JSON"),
        (["--lora-modules", '{"name": "x"}'], "needs string 'name' and 'path'"),
        (["--lora-modules", "justaname"], "expected name=path"),
    ]
    for argv, text in cases:
        with pytest.raises(SystemExit) as e:
            parse_server_args(["-m", "x.gguf", *argv])
        assert e.value.code == 2
        assert text in capsys.readouterr().err, argv


def test_anthropic_and_responses_answer_with_the_named_adapter(srv) -> None:
    base, down = chat(srv, None), chat(srv, "down")
    assert down != base  # the adapter changes this answer: not vacuous
    msg = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    r = srv.client.post("/v1/messages", json={**msg, "model": "DOWN"})
    assert r.status_code == 200, r.text
    assert "".join(c.get("text", "") for c in r.json()["content"]) == down
    resp = {"input": [{"role": "user", "content": "hi"}], "max_output_tokens": 8}
    r = srv.client.post("/v1/responses", json={**resp, "temperature": 0, "model": "down"})
    assert r.status_code == 200, r.text
    texts = [c["text"] for o in r.json()["output"] for c in o.get("content") or [] if "text" in c]
    assert "".join(texts) == down


def test_every_load_endpoint_keeps_the_same_rules(srv, dirs) -> None:
    lib, outside = dirs
    loads = [
        ("/v1/load_lora_adapter", lambda p, n: {"lora_name": n, "lora_path": p}),
        ("/load_lora_adapter", lambda p, n: {"lora_name": n, "lora_path": p}),
        ("/lora-adapters/load", lambda p, n: {"path": p, "name": n}),
    ]
    for path, body in loads:
        r = srv.client.post(path, json=body("up", "x"), headers={"Authorization": "Bearer no"})
        assert r.status_code == 401, (path, r.text)  # the API key first
        r = srv.client.post(path, json=body(str(outside / "mod"), "x"))
        assert r.status_code in (400, 403), (path, r.text)  # outside --lora-dir
        assert "--lora-dir" in r.text
    assert "x" not in [a["name"] for a in srv.client.get("/lora-adapters").json()]
    with serve_in_thread(["-c", "256", "--temp", "0"]) as bare:  # no --lora-dir
        r = bare.client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "up"})
        assert r.status_code == 501 and r.json()["error"]["type"] == "NotImplementedError"
        r = bare.client.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": "up"})
        assert r.status_code == 400 and r.json()["success"] is False
        assert "--lora-dir" in r.json()["error_message"]


def test_bad_input_is_a_4xx_naming_it(srv) -> None:
    cases = [  # (endpoint, body, status, text the message must hold)
        ("/v1/load_lora_adapter", {"lora_name": "l", "lora_path": "loop.gguf"}, 400, "loop.gguf"),
        ("/load_lora_adapter", {"lora_name": "l", "lora_path": "loop.gguf"}, 400, "loop.gguf"),
        ("/lora-adapters/load", {"path": "loop.gguf"}, 400, "loop.gguf"),
        (
            "/v1/load_lora_adapter",
            {"lora_name": "u", "lora_path": "up", "load_inplace": "yes"},
            400,
            "load_inplace",
        ),
        ("/v1/load_lora_adapter", {"lora_name": "a\x00b", "lora_path": "up"}, 400, "control"),
        ("/load_lora_adapter", {"lora_name": "a\nb", "lora_path": "up"}, 400, "control"),
        ("/lora-adapters/load", {"path": "up", "name": "a\tb"}, 400, "control"),
        (
            "/load_lora_adapter",
            {"lora_name": "p", "lora_path": "up", "pinned": "yes"},
            400,
            "pinned",
        ),
    ]
    for path, body, status, text in cases:
        r = srv.client.post(path, json=body)
        assert r.status_code == status, (path, body, r.text)
        assert text in r.text, (path, body, r.text)
    names = [a["name"] for a in srv.client.get("/lora-adapters").json()]
    assert not {"l", "u", "a\x00b", "a\nb", "a\tb", "p"} & set(names)
    r = srv.client.post("/completion", json={"prompt": "x", "lora": [{"name": "loop", "scale": 1}]})
    assert r.status_code == 404 and "'loop'" in r.text  # the catalogue never offers it


def test_global_scales_read_a_named_adapter_before_switching(srv) -> None:
    """`POST /lora-adapters` naming a catalogue adapter no request used yet reads it first:
    a broken file is a 400 naming it that changes nothing (before, the switch succeeded
    and every request without `lora` then failed on it); a good one answers at once."""
    base = complete(srv)["content"]
    r = srv.client.post("/lora-adapters", json=[{"name": "broken", "scale": 1.0}])
    assert r.status_code == 400 and "broken" in r.json()["error"]["message"], r.text
    assert complete(srv)["content"] == base
    assert "broken" not in [a["name"] for a in srv.client.get("/lora-adapters").json()]
    assert "side" not in [a["name"] for a in srv.client.get("/lora-adapters").json()]
    named = complete(srv, lora=[{"name": "down", "scale": 1.0}])["content"]
    try:
        r = srv.client.post("/lora-adapters", json=[{"name": "DOWN", "scale": 1.0}])
        assert r.status_code == 200, r.text
        assert complete(srv)["content"] == named != base
        r = srv.client.post("/lora-adapters", json=[{"name": "side", "scale": 1.0}])
        side = {a["name"]: a for a in srv.client.get("/lora-adapters").json()}["side"]
        assert r.status_code == 200 and side["loaded"] and side["scale"] == 1.0  # read at once
        assert (
            complete(srv)["content"]
            == complete(srv, lora=[{"name": "side", "scale": 1.0}])["content"]
        )
    finally:
        assert srv.client.post("/lora-adapters", json=[]).status_code == 200
    assert complete(srv)["content"] == base
