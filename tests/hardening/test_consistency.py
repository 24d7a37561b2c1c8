"""A running request's output never changes while the server's configuration does.

Long generations (streaming and plain, under a snapshot of the global scales or under their
own `lora` list) run while other clients switch the global scales, load adapters and unload
others; each answer equals the cache-off answer computed before under the same mix, and an
unload of the adapter a running request uses waits for it to finish.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.server_util import Served, peft_folder, serve_in_thread

PROMPT = "the cat and the dog of the house is in the"
N = 300
STEP_DELAY_S = 0.004  # slows each engine step so the generations outlast the changes


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cons-loras")
    for i, name in enumerate(("a", "b", "c", "d")):
        peft_folder(d / name, 40 + i)
    return d


@pytest.fixture()
def srv(lora_dir):
    lora = ["--lora", str(lora_dir / "a"), "--lora", str(lora_dir / "b")]
    args = ["-np", "3", "-c", "1536", "--temp", "0", "--lora-dir", str(lora_dir), *lora]
    with serve_in_thread([*args, "--lora-init-without-apply"]) as s:
        yield s


def slow_engine(srv: Served) -> None:
    runner = srv.app.state.server.engine.core.runner
    forward = runner.forward

    def slowed(items):
        time.sleep(STEP_DELAY_S)
        return forward(items)

    runner.forward = slowed


def ok(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def body(**kw) -> dict:
    return {"prompt": PROMPT, "n_predict": N, "ignore_eos": True, **kw}


def reference(srv: Served, lora: list[dict]) -> str:
    return ok(srv.client.post("/completion", json=body(lora=lora, cache_prompt=False)))["content"]


def stream(srv: Served, req: dict, first: threading.Event, out: dict) -> None:
    with srv.client.stream("POST", "/completion", json={**req, "stream": True}) as r:
        assert r.status_code == 200
        evs = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                evs.append(json.loads(line[6:]))
                first.set()
    out["text"] = "".join(e["content"] for e in evs)
    out["final"] = evs[-1]


def busy(srv: Served) -> int:
    return sum(s["is_processing"] for s in srv.client.get("/slots").json())


def perturb(srv: Served, actions: list[Callable[[], None]]) -> None:
    for act in actions:
        act()
    assert busy(srv) > 0, "the generations ended before the changes: raise N or the delay"


def test_changes_during_generation_never_change_running_output(srv) -> None:
    c = srv.client
    ref_a = reference(srv, [{"id": 0, "scale": 1.0}])
    ref_b = reference(srv, [{"id": 1, "scale": 0.5}])
    assert ref_a != ref_b
    ok(c.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}]))
    slow_engine(srv)
    first = [threading.Event(), threading.Event()]
    outs: list[dict] = [{}, {}, {}]
    threads = [
        threading.Thread(target=stream, args=(srv, body(), first[0], outs[0])),  # global: a
        threading.Thread(
            target=stream, args=(srv, body(lora=[{"id": 1, "scale": 0.5}]), first[1], outs[1])
        ),
        threading.Thread(
            target=lambda: outs[2].update(ok(c.post("/completion", json=body())))  # global: a
        ),
    ]
    for t in threads:
        t.start()
    assert first[0].wait(30) and first[1].wait(30)
    loaded: dict = {}
    perturb(
        srv,
        [
            lambda: ok(c.post("/lora-adapters", json=[{"id": 1, "scale": 1.0}])),
            lambda: loaded.update(ok(c.post("/lora-adapters/load", json={"path": "c"}))),
            lambda: ok(c.post("/lora-adapters", json=[{"id": loaded["id"], "scale": 0.7}])),
            lambda: ok(c.post("/lora-adapters/load", json={"path": "d", "scale": 2.0})),
            lambda: ok(c.post("/lora-adapters/unload", json={"id": loaded["id"]})),
            lambda: ok(c.post("/lora-adapters", json=[])),
        ],
    )
    for t in threads:
        t.join(120)
    assert outs[0]["text"] == ref_a and outs[2]["content"] == ref_a
    assert outs[0]["final"]["generation_settings"]["lora"] == [{"id": 0, "scale": 1.0}]
    assert outs[1]["text"] == ref_b
    assert outs[1]["final"]["generation_settings"]["lora"] == [{"id": 1, "scale": 0.5}]


def test_unloading_a_running_requests_adapter_waits_for_it(srv) -> None:
    c = srv.client
    ref_b = reference(srv, [{"id": 1, "scale": 0.5}])
    slow_engine(srv)
    first, out = threading.Event(), {}
    t = threading.Thread(
        target=stream, args=(srv, body(lora=[{"id": 1, "scale": 0.5}]), first, out)
    )
    t.start()
    assert first.wait(30)
    unloaded: list[dict] = []
    u = threading.Thread(
        target=lambda: unloaded.append(ok(c.post("/lora-adapters/unload", json={"id": 1})))
    )
    u.start()
    perturb(
        srv,
        [
            lambda: ok(c.post("/lora-adapters/unload", json={"id": 0})),  # not in use: at once
            lambda: ok(c.post("/lora-adapters/load", json={"path": "c", "scale": 1.0})),
            lambda: time.sleep(0.3),
        ],
    )
    waiting = u.is_alive()
    assert waiting and busy(srv) > 0, "the unload of a running request's adapter did not wait"
    t.join(120)
    u.join(60)
    assert out["text"] == ref_b
    assert unloaded == [{"success": True}]
    ids = [a["id"] for a in c.get("/lora-adapters").json()]
    assert 0 not in ids and 1 not in ids
