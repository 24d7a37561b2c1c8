"""Router mode (no `-m`, `--models-dir` / `--models-preset`) over HTTP, on tiny models:
llama-server's lifecycle (load on request or on `POST /models/load`, `?autoload=false`, LRU
unload past `--models-max`, unload, a broken file reported in `GET /models` while the router
keeps serving) with its status codes and error bodies (tools/server/server-models.cpp), and
**ours**: presets over one base share one engine, each answering bit-identically (greedy
tokens and n_probs) to the same adapter mix sent to a single server, its prefix cache kept
apart from the other presets' (a prompt warmed under one mix is never reused by another)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.http.router_util import PROMPT, complete, error, router, status, wait_status
from tests.server_util import peft_folder, serve_in_thread, tiny_model_path
from tests.tiny import hf_model, write_gguf


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copy(tiny_model_path(), d / "tiny.gguf")
    write_gguf(d / "other.gguf", hf_model("llama", seed=11), "llama")
    (d / "broken.gguf").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    (d / "mmproj-tiny.gguf").write_bytes(b"")  # a companion file: not a model
    return d


def test_router_lifecycle(models_dir: Path) -> None:
    with router(["--models-dir", str(models_dir), "--models-max", "1", "-c", "256"]) as (c, _):
        props = c.get("/props").json()
        assert props["role"] == "router" and props["max_instances"] == 1
        assert props["models_autoload"] is True
        listed = c.get("/v1/models").json()
        assert listed["object"] == "list"
        in_dir = [m for m in listed["data"] if m["source"] == "models_dir"]
        assert sorted(m["id"] for m in in_dir) == ["broken", "other", "tiny"]
        assert {m["source"] for m in listed["data"]} <= {"models_dir", "cache"}  # + default
        assert all(m["status"]["value"] == "unloaded" for m in listed["data"])
        # llama-server's validation answers
        error(c.post("/completion", json={"prompt": "x"}), 400, "invalid_request_error",
              "model name is missing from the request")  # fmt: skip
        error(complete(c, "nope"), 400, "invalid_request_error", "model 'nope' not found")
        error(c.get("/props?model=tiny&autoload=false"), 400, "invalid_request_error",
              "model is not loaded")  # fmt: skip
        error(c.get("/health?model=tiny"), 503, "unavailable_error", "model is not loaded")
        error(c.post("/models/load", json={"model": "nope"}), 404, "not_found_error",
              "model is not found")  # fmt: skip
        error(c.post("/models/unload", json={"model": "tiny"}), 400, "invalid_request_error",
              "model is not running")  # fmt: skip
        # autoload on first request, routed by `model`
        r = complete(c, "tiny")
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
        assert status(c, "tiny")["value"] == "loaded"
        assert c.get("/health?model=tiny").json() == {"status": "ok"}
        assert c.get("/props?model=tiny").json()["model_path"].endswith("tiny.gguf")
        error(c.post("/models/load", json={"model": "tiny"}), 400, "invalid_request_error",
              "model is already running")  # fmt: skip
        # POST /models/load, LRU unload past --models-max 1
        assert c.post("/models/load", json={"model": "other"}).json() == {"success": True}
        wait_status(c, "other", "loaded")
        assert status(c, "tiny")["value"] == "unloaded"
        oai = complete(c, "other", "/v1/completions", max_tokens=2).json()
        assert oai["object"] == "text_completion"
        assert status(c, "tiny")["value"] == "unloaded"
        # a broken file: reported, the router serves on
        assert c.post("/models/load", json={"model": "broken"}).json() == {"success": True}
        s = wait_status(c, "broken", "unloaded")
        deadline = time.monotonic() + 60
        while not s.get("failed"):
            assert time.monotonic() < deadline
            s = status(c, "broken")
        assert s["exit_code"] == 1 and s["error"]
        r = complete(c, "broken")
        error(r, 500, "server_error", "model name=broken failed to load")
        assert c.get("/health").json() == {"status": "ok"}
        # unloaded right after a load request (while loading, most likely): stays unloaded
        assert c.post("/models/load", json={"model": "other"}).json() == {"success": True}
        assert c.post("/models/unload", json={"model": "other"}).json() == {"success": True}
        time.sleep(0.5)
        assert status(c, "other") == {"value": "unloaded", "args": status(c, "other")["args"]}
        assert complete(c, "tiny").status_code == 200  # and past --models-max again
        assert c.post("/models/unload", json={"model": "tiny"}).json() == {"success": True}
        assert status(c, "tiny")["value"] == "unloaded"


PRESETS = """
version = 1
[*]
c = 256
np = 2
chat-template-file = {template}

[plain]
model = {base}

[mix-a]
model = {base}
lora-scaled = {a}:0.7

[mix-ab]
model = {base}
lora = {a}
lora-scaled = {b}:0.5

[short]
model = {base}
lora-scaled = {b}:1.5
n-predict = 3

[needs-file]
c = 128

[kwargs]
model = {base}
chat-template-kwargs = {{"extra": "yes"}}

[narrow]
model = {base}
c = 128
np = 1
"""


def test_presets_share_one_engine(tmp_path: Path) -> None:
    base = tiny_model_path()
    a, b = peft_folder(tmp_path / "a", seed=1), peft_folder(tmp_path / "b", seed=2)
    ini = tmp_path / "presets.ini"
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}{{ m.content }};{% endfor %}{{ extra | default('-') }}"
    )
    ini.write_text(PRESETS.format(base=base, a=a, b=b, template=template))
    mixes = {
        "plain": [],
        "mix-a": [{"id": 0, "scale": 0.7}],
        "mix-ab": [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}],
    }
    single_args = ["-c", "256", "-np", "2", "--lora", f"{a},{b}", "--lora-init-without-apply"]
    with serve_in_thread(single_args) as single:
        expected = {
            name: single.client.post(
                "/completion",
                json={
                    "prompt": PROMPT,
                    "n_predict": 6,
                    "temperature": 0,
                    "n_probs": 3,
                    "lora": mix,
                },  # fmt: skip
            ).json()
            for name, mix in mixes.items()
        }
    with router(["--models-preset", str(ini), "--models-max", "1"]) as (c, state):
        listed = {m["id"]: m for m in c.get("/models").json()["data"]}
        assert listed["needs-file"]["status"]["failed"] is True  # no model: listed, failed
        assert listed["mix-a"]["status"]["preset"].startswith("model = ")
        for name in mixes:  # plain first: its prompt's KV must not serve the mixes
            got = complete(c, name, n_predict=6, n_probs=3).json()
            want = expected[name]
            assert got["content"] == want["content"], name
            assert got["completion_probabilities"] == want["completion_probabilities"], name
            assert got["model"] == name  # the preset's name, not the shared engine's
        answers = {n: complete(c, n, n_predict=6).json()["content"] for n in mixes}
        assert len(set(answers.values())) == 3  # the mixes really differ
        chat = c.post("/v1/chat/completions", json={"model": "plain", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert chat.status_code == 200 and chat.json()["model"] == "plain"
        stream = {"model": "plain", "prompt": "x", "max_tokens": 2, "stream": True}
        text = c.post("/v1/completions", json=stream).text
        events = [e for e in text.split("\n\n") if e.startswith("data: {")]
        assert events and all(json.loads(e[6:])["model"] == "plain" for e in events)
        assert c.get("/props?model=plain").json()["model_alias"] == "plain"
        short = complete(c, "short", n_predict=None).json()  # the preset's n-predict = 3
        assert short["tokens_predicted"] == 3
        assert complete(c, "short", n_predict=5).json()["tokens_predicted"] == 5
        # template kwargs per preset, over the request's own, on the same engine
        msgs = {"messages": [{"role": "user", "content": "hi"}]}
        own = {"chat_template_kwargs": {"extra": "own"}}
        prompts = [
            c.post("/apply-template", json={"model": n, **msgs, **kw}).json()["prompt"]
            for n, kw in [("plain", {}), ("kwargs", {}), ("kwargs", own)]
        ]
        assert prompts == ["hi;-", "hi;yes", "hi;own"]
        # one engine for the four presets of one base, under --models-max 1
        running = [e for e in state.pool.engines.values() if e.running]
        assert len(running) == 1 and len(running[0].cfg.lora) == 2
        assert all(status(c, n)["value"] == "loaded" for n in [*mixes, "short"])
        # other engine settings: an engine of its own (LRU-unloading the shared one)
        assert complete(c, "narrow").status_code == 200
        assert (
            status(c, "narrow")["value"] == "loaded" and status(c, "plain")["value"] == "unloaded"
        )


def test_router_api_key(models_dir: Path) -> None:
    """The key guards the router's routes and the forwarded ones; the public ones (health,
    the model list) never load a model."""
    with router(["--models-dir", str(models_dir), "--api-key", "sk-r"]) as (c, state):
        assert c.get("/models").status_code == 200
        for r in (
            c.post("/models/load", json={"model": "tiny"}),
            c.post("/models/unload", json={"model": "tiny"}),
            complete(c, "tiny"),
            c.get("/props?model=tiny"),
        ):
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert c.get("/health?model=tiny").status_code == 503
        assert not any(e.running for e in state.pool.engines.values())
        key = {"Authorization": "Bearer sk-r"}
        assert c.post("/models/load", json={"model": "tiny"}, headers=key).status_code == 200


def test_models_sse_reports_status_changes(models_dir: Path) -> None:
    """`GET /models/sse` streams llama-server's `status_change` events: a load is `loading`
    then `loaded`, an unload `unloaded` with exit code 0, a broken file `unloaded` with 1;
    `?reload=1` sends `models_reload` for "*"."""
    with router(["--models-dir", str(models_dir), "-c", "256"]) as (c, _):
        events: list[dict] = []
        opened = threading.Event()

        def listen() -> None:
            with httpx.stream("GET", f"{c.base_url}/models/sse", timeout=60) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                for line in r.iter_lines():
                    if line.startswith(":"):  # subscribed: every later change reaches us
                        opened.set()
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                    if len(events) >= 6:
                        return

        t = threading.Thread(target=listen, daemon=True)
        t.start()
        assert opened.wait(30)
        assert c.post("/models/load", json={"model": "tiny"}).json() == {"success": True}
        wait_status(c, "tiny", "loaded")
        assert c.post("/models/unload", json={"model": "tiny"}).json() == {"success": True}
        c.post("/models/load", json={"model": "broken"})
        deadline = time.monotonic() + 30
        while len(events) < 5:
            assert time.monotonic() < deadline, events
            time.sleep(0.02)
        c.get("/models?reload=1")
        t.join(30)
    change = [(e["model"], e["data"]["status"], e["data"].get("exit_code")) for e in events[:5]]
    assert change == [
        ("tiny", "loading", None), ("tiny", "loaded", None), ("tiny", "unloaded", 0),
        ("broken", "loading", None), ("broken", "unloaded", 1),
    ]  # fmt: skip
    assert all(e["event"] == "status_change" for e in events[:5])
    assert events[5] == {"model": "*", "event": "models_reload"}
