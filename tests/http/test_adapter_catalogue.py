"""The adapter catalogue over HTTP: adapters under `--lora-dir` served by name on first use
(`model` on the OpenAI, Anthropic and Responses APIs, `lora` entries by `name`), listed by
`/v1/models` and `/lora-adapters?catalogue=true`, memory tiers (`--lora-max-loaded`) with
warm KV after a reload, the metrics, and vLLM's and SGLang's load/unload endpoints with
their own field names and answers (vllm/entrypoints/openai/models/serving.py, sglang's
http_server.py and io_struct.py `LoRAUpdateOutput`).

The oracle for an adapter's answer is the same adapter loaded explicitly and named by id
(the engine's maths are checked against PEFT in tests/unit/lora).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.server_util import peft_folder, scrape_metrics, serve_in_thread

PROMPT = "the cat and the"


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("catalogue")
    peft_folder(d / "up", 1)
    peft_folder(d / "down", 2)
    (d / "noise.gguf").write_bytes(os.urandom(256))
    return d


@pytest.fixture(scope="module")
def srv(lora_dir):
    args = ["-np", "2", "-c", "512", "--temp", "0", "--lora-dir", str(lora_dir)]
    args += ["--lora-max-loaded", "1", "--metrics", "--api-key", "k"]
    with serve_in_thread(args) as s:
        s.client.headers["Authorization"] = "Bearer k"
        yield s


def complete(srv, expect: int = 200, **kw) -> dict:
    body = {"prompt": PROMPT, "n_predict": 8, "ignore_eos": True, **kw}
    r = srv.client.post("/completion", json=body)
    assert r.status_code == expect, r.text
    return r.json()


def registered(srv) -> dict[str, dict]:
    return {a["name"]: a for a in srv.client.get("/lora-adapters").json()}


def test_first_use_by_name_on_every_api(srv) -> None:
    base = complete(srv)["content"]
    by_name = complete(srv, lora=[{"name": "up", "scale": 1.0}])
    up = registered(srv)["up"]
    assert up["loaded"] and not up["pinned"]
    by_id = complete(srv, lora=[{"id": up["id"], "scale": 1.0}])
    assert by_name["content"] == by_id["content"] != base
    body = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, "model": "down"}
    oai = srv.client.post("/v1/completions", json=body).json()
    assert (
        oai["choices"][0]["text"] == complete(srv, lora=[{"name": "DOWN", "scale": 1.0}])["content"]
    )
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "model": "up"}
    r = srv.client.post("/v1/chat/completions", json=chat)
    assert r.status_code == 200 and r.json()["model"] == "up"
    msg = {**chat, "model": "down"}
    assert srv.client.post("/v1/messages", json=msg).status_code == 200
    resp = {"input": "hi", "max_output_tokens": 2, "model": "up"}
    assert srv.client.post("/v1/responses", json=resp).status_code == 200


def test_missing_and_bad_names(srv) -> None:
    r = srv.client.post(
        "/completion", json={"prompt": PROMPT, "lora": [{"name": "nope", "scale": 1}]}
    )
    assert r.status_code == 404 and "'nope'" in r.json()["error"]["message"]
    r = srv.client.post(
        "/completion", json={"prompt": PROMPT, "lora": [{"name": "noise", "scale": 1}]}
    )
    assert r.status_code == 400 and "noise.gguf" in r.json()["error"]["message"]
    r = srv.client.post(
        "/completion", json={"prompt": PROMPT, "lora": [{"id": 0, "name": "up", "scale": 1}]}
    )
    assert r.status_code == 400 and "lora" in r.json()["error"]["message"]
    assert "noise" not in registered(srv)


def test_listings_offer_the_catalogue(srv, lora_dir) -> None:
    models = {m["id"]: m for m in srv.client.get("/v1/models").json()["data"]}
    assert {"up", "down", "noise"} <= models.keys()
    for name in ("up", "down", "noise"):
        assert models[name]["parent"] == "tiny.gguf"
        assert Path(models[name]["root"]).name.startswith(name)
    listed = {a["name"]: a for a in srv.client.get("/lora-adapters?catalogue=true").json()}
    assert {"up", "down", "noise"} <= listed.keys()


def test_tiers_evict_and_reload_warm(srv) -> None:
    first = complete(srv, lora=[{"name": "up", "scale": 1.0}])
    complete(srv, lora=[{"name": "down", "scale": 1.0}])
    complete(srv)  # a step after both finished: the idle overflow goes
    state = registered(srv)
    assert state["down"]["loaded"] and not state["up"]["loaded"]
    loads = scrape_metrics(srv)["loraserve:lora_loads_total"]
    again = complete(srv, lora=[{"name": "up", "scale": 1.0}])
    assert again["content"] == first["content"]
    assert again["timings"]["cache_n"] >= again["tokens_evaluated"] - 1
    m = scrape_metrics(srv)
    assert m["loraserve:lora_loads_total"] == loads + 1
    assert m["loraserve:lora_evictions_total"] >= 2 and m["loraserve:lora_resident"] >= 1
    assert m["loraserve:lora_resident_bytes"] > 0 and m["loraserve:lora_load_seconds_total"] > 0


def test_vllm_endpoints(srv, lora_dir, tmp_path) -> None:
    shutil.copytree(lora_dir / "up", lora_dir / "v-up")
    post = srv.client.post
    r = post("/v1/load_lora_adapter", json={"lora_name": "mine", "lora_path": "v-up"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'mine' added successfully."
    r = post("/v1/load_lora_adapter", json={"lora_name": "mine", "lora_path": "down"})
    assert r.status_code == 400 and r.json() == {
        "error": {
            "message": "The lora adapter 'mine' has already been loaded. If you want to load "
            "the adapter in place, set 'load_inplace' to True.",
            "type": "InvalidUserInput",
            "param": None,
            "code": 400,
        }
    }
    up = complete(srv, lora=[{"name": "up", "scale": 1.0}])["content"]
    body = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, "model": "mine"}
    first = srv.client.post("/v1/completions", json=body).json()
    assert first["choices"][0]["text"] == up
    peft_folder(lora_dir / "v-new", 5)  # a content no request used yet
    r = post(
        "/v1/load_lora_adapter",
        json={"lora_name": "mine", "lora_path": "v-new", "load_inplace": True},
    )
    assert r.status_code == 200
    swapped = srv.client.post("/v1/completions", json=body).json()
    assert swapped["timings"]["cache_n"] == 0  # a new content: a new cache key, no old KV
    named = complete(srv, lora=[{"name": "v-new", "scale": 1.0}])
    assert swapped["choices"][0]["text"] == named["content"] != up
    assert named["timings"]["cache_n"] > 0  # the same content shares its KV across names
    assert "mine" in [m["id"] for m in srv.client.get("/v1/models").json()["data"]]
    cases = [
        ({"lora_name": "x"}, 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path'"),
        (
            {"lora_name": "x", "lora_path": "gone"},
            404,
            "NotFoundError",
            "No adapter found for gone",
        ),
        ({"lora_name": "x", "lora_path": str(tmp_path)}, 403, "PermissionError", "--lora-dir"),
        ({"lora_name": "x", "lora_path": "noise.gguf"}, 400, "BadRequestError", "noise.gguf"),
    ]
    for body, status, kind, text in cases:
        r = post("/v1/load_lora_adapter", json=body)
        err = r.json()["error"]
        assert (r.status_code, err["type"], err["code"]) == (status, kind, status), r.text
        assert text in err["message"]
    r = post("/v1/unload_lora_adapter", json={"lora_name": "mine"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'mine' removed successfully."
    r = post("/v1/unload_lora_adapter", json={"lora_name": "mine"})
    assert r.status_code == 404 and r.json()["error"] == {
        "message": "The lora adapter 'mine' cannot be found.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    r = post("/v1/unload_lora_adapter", json={})
    assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidUserInput"
    r = srv.client.post("/v1/load_lora_adapter", headers={"Authorization": "Bearer bad"}, json={})
    assert r.status_code == 401


def test_sglang_endpoints(srv, lora_dir) -> None:
    shutil.copytree(lora_dir / "down", lora_dir / "s-down")
    post = srv.client.post
    r = post("/load_lora_adapter", json={"lora_name": "pin", "lora_path": "s-down", "pinned": True})
    body = r.json()
    assert r.status_code == 200 and body["success"] is True and body["error_message"] is None
    assert body["loaded_adapters"]["pin"] == str(lora_dir.resolve() / "s-down")
    assert registered(srv)["pin"]["pinned"]
    r = post("/load_lora_adapter", json={"lora_name": "pin", "lora_path": "up"})
    message = "Failed to load LoRA adapter pin because it is already loaded"
    assert (
        r.status_code == 400
        and {
            "success": False,
            "error_message": message,
            "loaded_adapters": None,
        }.items()
        <= r.json().items()
    )
    assert r.json()["error"] == {"code": 400, "message": message, "type": "invalid_request_error"}
    for name in ("up", "down", "up"):  # --lora-max-loaded 1: the pinned one stays
        complete(srv, lora=[{"name": name, "scale": 1.0}])
    complete(srv)
    assert registered(srv)["pin"]["loaded"]
    r = post("/unload_lora_adapter", json={"lora_name": "pin"})
    assert r.status_code == 200 and "pin" not in r.json()["loaded_adapters"]
    r = post("/unload_lora_adapter", json={"lora_name": "pin"})
    assert r.status_code == 400 and r.json()["success"] is False
    assert "pin" in r.json()["error_message"]


def test_global_scales_by_name(srv) -> None:
    """`POST /lora-adapters` takes `{name, scale}` entries beside `{id, scale}`: a catalogue
    adapter named there answers requests without a `lora` list as if each named it; an
    unknown name is a 400 naming it that changes nothing."""
    base = complete(srv)["content"]
    named = complete(srv, lora=[{"name": "down", "scale": 1.0}])["content"]
    try:
        r = srv.client.post("/lora-adapters", json=[{"name": "DOWN", "scale": 1.0}])
        assert r.status_code == 200, r.text
        assert complete(srv)["content"] == named != base
        down = registered(srv)["down"]
        assert down["scale"] == 1.0
        r = srv.client.post("/lora-adapters", json=[{"name": "nope", "scale": 1.0}])
        assert r.status_code == 400 and "'nope'" in r.json()["error"]["message"]
        r = srv.client.post("/lora-adapters", json=[{"id": down["id"], "name": "down"}])
        assert r.status_code == 400
        assert complete(srv)["content"] == named  # the bad lists changed nothing
    finally:
        assert srv.client.post("/lora-adapters", json=[]).status_code == 200
    assert complete(srv)["content"] == base
