"""`loraserve ray` on a local Ray cluster, 2 replicas of the tiny model: answers equal a
single server's, one adapter mix lands on one replica while both serve, a global change
reaches every replica before it is acknowledged, and a killed replica's in-flight requests
answer 503 while Ray replaces it (the order of the tests matters: the kill is last)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from tests.ray.conftest import NO_RAY, RayApp, serve_argv
from tests.server_util import concurrently, serve_in_thread

ray = pytest.importorskip("ray.serve", reason=NO_RAY) and pytest.importorskip("ray")

from loraserve.cluster.asgi_host import HttpCall  # noqa: E402
from loraserve.cluster.merge import REPLICA_HEADER  # noqa: E402

GREEDY = {"temperature": 0, "n_predict": 12}
REQUESTS: list[tuple[str, dict[str, Any]]] = [  # bodies without temperature get GREEDY
    ("/completion", {"prompt": "hello world", **GREEDY}),
    ("/completion", {"prompt": "hello world", "lora": [{"id": 0, "scale": 0.0}], **GREEDY}),
    ("/completion", {"prompt": "a b c", "lora": [{"id": 1, "scale": 0.5}], **GREEDY}),
    ("/completion", {"prompt": [1, 2, 3], "lora": [{"id": 0, "scale": 1}, {"id": 1, "scale": -1}]}),
    ("/completion", {"prompt": "x", "n_probs": 2, **GREEDY}),
    ("/v1/completions", {"prompt": "once upon", "model": "a1", "max_tokens": 8, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **GREEDY}),
    ("/tokenize", {"content": "hello world"}),
]  # fmt: skip


def answer_of(path: str, body: dict[str, Any]) -> Any:
    """What must be equal: the generated text and tokens (not the timings or ids)."""
    if path == "/completion":
        keep = ("content", "tokens", "stop_type", "completion_probabilities", "generation_settings")
        out = {k: body.get(k) for k in keep}
        out["generation_settings"] = out["generation_settings"]["lora"]
        return out
    if path.startswith("/v1/"):
        return [c.get("text") or c["message"]["content"] for c in body["choices"]]
    return body


def per_replica(app: RayApp, path: str) -> dict[str, Any]:
    """Every registered replica's own answer to GET ``path``, asked at once (not ordered
    behind the writes in progress: what each replica holds now)."""
    answers = ray.get(app.coordinator().broadcast.remote(HttpCall("GET", path), "query"))
    return {rid: json.loads(a.body) for rid, a in answers.items()}


def test_answers_equal_a_single_server(ray_app: RayApp, adapters) -> None:
    with serve_in_thread(serve_argv(adapters)) as single:
        for path, body in REQUESTS:
            body = body if "temperature" in body or path == "/tokenize" else {**body, **GREEDY}
            want = single.client.post(path, json=body)
            got = ray_app.client.post(path, json=body)
            assert got.status_code == want.status_code == 200, (path, got.text)
            assert got.headers[REPLICA_HEADER]
            assert answer_of(path, got.json()) == answer_of(path, want.json()), path
        stream = {"prompt": "hello world", "stream": True, **GREEDY}
        want = single.sse_json("/completion", stream)
        with ray_app.client.stream("POST", "/completion", json=stream) as r:
            assert r.status_code == 200 and r.headers[REPLICA_HEADER]
            got = [
                json.loads(e.removeprefix("data: ")) for e in r.read().decode().split("\n\n") if e
            ]
        assert [e["content"] for e in got] == [e["content"] for e in want]
        unknown = {"prompt": "x", "lora": [{"id": 9, "scale": 1}]}
        bad, want_bad = (
            ray_app.client.post("/completion", json=unknown),
            single.client.post("/completion", json=unknown),
        )
        assert bad.status_code == want_bad.status_code == 400
        assert bad.json() == want_bad.json()
        assert (
            ray_app.client.get("/lora-adapters").json()
            == single.client.get("/lora-adapters").json()
        )


def test_one_mix_lands_on_one_replica_and_both_serve(ray_app: RayApp) -> None:
    where: dict[float, set[str]] = {}
    for scale in [round(0.1 * k, 1) for k in range(1, 13)]:
        for _ in range(3):
            body = {"prompt": "the same prefix " * 4, "lora": [{"id": 1, "scale": scale}], **GREEDY}
            r = ray_app.client.post("/completion", json=body)
            assert r.status_code == 200, r.text
            where.setdefault(scale, set()).add(r.headers[REPLICA_HEADER])
    assert all(len(r) == 1 for r in where.values()), where
    assert len(set().union(*where.values())) == 2, where
    metrics = ray_app.client.get("/metrics").text
    served = {
        line.split('"')[1]
        for line in metrics.splitlines()
        if line.startswith("loraserve:requests_finished_total{") and not line.endswith(" 0")
    }
    assert served == set().union(*where.values()), metrics


def test_a_saturated_replica_spills_to_the_other(ray_app: RayApp) -> None:
    body = {
        "prompt": "spill",
        "lora": [{"id": 1, "scale": 0.9}],
        "n_predict": 64,
        "ignore_eos": True,
    }
    where: list[str] = []

    def post(_: int) -> None:
        with httpx.Client(base_url=str(ray_app.client.base_url), timeout=60) as c:
            r = c.post("/completion", json=body)
            assert r.status_code == 200, r.text
            where.append(r.headers[REPLICA_HEADER])

    concurrently(post, range(10))  # more than one replica's max_ongoing_requests (4)
    assert len(set(where)) == 2, where


def test_global_changes_reach_every_replica_before_the_ack(ray_app: RayApp) -> None:
    stop = threading.Event()

    def traffic() -> None:  # requests in flight while the scales change
        with httpx.Client(base_url=str(ray_app.client.base_url), timeout=60) as c:
            while not stop.is_set():
                assert (
                    c.post("/completion", json={"prompt": "a", "n_predict": 4}).status_code == 200
                )

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        for scale in (0.25, 0.75, 0.0):
            r = ray_app.client.post(
                "/lora-adapters", json=[{"id": 0, "scale": 1}, {"id": 1, "scale": scale}]
            )
            assert r.status_code == 200 and len(r.headers[REPLICA_HEADER].split(",")) == 2, r.text
            held = per_replica(ray_app, "/lora-adapters")
            assert len(held) == 2
            assert all([a["scale"] for a in listed] == [1, scale] for listed in held.values()), held
        r = ray_app.client.post("/lora-adapters/load", json={"path": "a2", "name": "third"})
        assert r.status_code == 200 and r.json()["id"] == 2, r.text
        held = per_replica(ray_app, "/lora-adapters")
        assert all([a["name"] for a in listed] == ["a0", "a1", "third"] for listed in held.values())
        body = {"prompt": "q", "model": "third", **GREEDY}
        assert ray_app.client.post("/v1/completions", json=body).status_code == 200
        assert (
            ray_app.client.post("/lora-adapters", json=[{"id": 7, "scale": 1}]).status_code == 400
        )
    finally:
        stop.set()
        thread.join(30)


def test_a_client_that_leaves_frees_its_slot(ray_app: RayApp) -> None:
    body = {"prompt": "leave", "n_predict": 240, "ignore_eos": True}
    t0 = time.monotonic()
    assert ray_app.client.post("/completion", json=body).status_code == 200
    whole = time.monotonic() - t0  # the whole request, for comparison
    with ray_app.client.stream("POST", "/completion", json={**body, "stream": True}) as r:
        home = r.headers[REPLICA_HEADER]
        next(r.iter_lines())
    left = time.monotonic()
    while any(s["is_processing"] for s in per_replica(ray_app, "/slots")[home]):
        time.sleep(0.01)
    print(f"freed {time.monotonic() - left:.3f} s after the client left; whole {whole:.3f} s")
    assert time.monotonic() - left < whole / 2, "the request kept running after its client left"


def test_a_killed_replica_answers_503_and_is_replaced(ray_app: RayApp) -> None:
    body = {
        "prompt": "kill",
        "lora": [{"id": 0, "scale": 0.3}],
        "n_predict": 200,
        "ignore_eos": True,
    }
    home = ray_app.client.post("/completion", json={**body, "n_predict": 1}).headers[REPLICA_HEADER]
    plain: list[tuple[int, str, dict]] = []
    streamed: list[str] = []

    def post(_: int) -> None:
        with httpx.Client(base_url=str(ray_app.client.base_url), timeout=60) as c:
            r = c.post("/completion", json=body)
            plain.append((r.status_code, r.headers[REPLICA_HEADER], r.json()))

    def stream() -> None:
        with httpx.Client(base_url=str(ray_app.client.base_url), timeout=60) as c:
            with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
                streamed.extend(r.iter_lines())

    threads = [threading.Thread(target=post, args=(i,)) for i in range(2)]
    threads.append(threading.Thread(target=stream))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while sum(s["is_processing"] for s in per_replica(ray_app, "/slots")[home]) < 3:
        assert time.monotonic() - t0 < 30, "the requests did not start"
    ray.kill(ray.get_actor(f"SERVE_REPLICA::loraserve#replica#{home}", namespace="serve"))
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a request to the killed replica hung"
    assert [(code, where) for code, where, _ in plain] == [(503, home)] * 2, plain
    assert all(b["error"]["type"] == "unavailable_error" for _, _, b in plain)
    last = json.loads(next(x for x in reversed(streamed) if x).removeprefix("data: "))
    assert last.get("error", {}).get("code") == 503, last
    assert time.monotonic() - t0 < 30
    ray_app.wait_healthy(90)
    held = per_replica(ray_app, "/lora-adapters")
    assert home not in held and len(held) == 2
    assert len({json.dumps(v) for v in held.values()}) == 1  # the new one replayed the writes
    assert [a["name"] for a in next(iter(held.values()))] == ["a0", "a1", "third"]
    r = ray_app.client.post("/completion", json={**body, "n_predict": 4})
    assert r.status_code == 200 and r.headers[REPLICA_HEADER] != home


@pytest.mark.parametrize("path", ["/health", "/metrics", "/props", "/v1/models"])
def test_every_answer_names_its_replica(ray_app: RayApp, path: str) -> None:
    r = ray_app.client.get(path)
    assert r.status_code == 200 and r.headers[REPLICA_HEADER], (path, r.text)
