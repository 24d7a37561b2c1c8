"""Vertex AI's prediction protocol (`AIP_MODE=PREDICTION`), as llama-server: `/predict`
runs each instance through the endpoint its `@requestFormat` names, concurrently, and
answers each one's body (or error object) in order; the API key applies to the whole call."""

from __future__ import annotations

import json
import socket
import time

import pytest

from loraserve.server.vertex.gcp import format_of
from tests.server_util import serve_in_thread

KEY = "sk-vertex"


@pytest.fixture(scope="module")
def srv():
    mp = pytest.MonkeyPatch()
    mp.setenv("AIP_MODE", "PREDICTION")
    mp.setenv("AIP_HEALTH_ROUTE", "/ping")
    try:
        with serve_in_thread(["-np", "2", "-c", "512", "--api-key", KEY]) as s:
            yield s
    finally:
        mp.undo()


AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"prompt": "the cat", "n_predict": 4, "temperature": 0}


def test_format_names_follow_llama_server() -> None:
    assert format_of("/v1/chat/completions") == "chatCompletions"
    assert format_of("/apply-template") == "applyTemplate"
    assert format_of("/completion") == "completion"
    assert format_of("/slots/{id_slot}") == "slots"


def test_instances_answer_as_their_endpoints_in_order(srv) -> None:
    body = {"instances": [
        {"@requestFormat": "chatCompletions", **CHAT, "stream": True},
        {"@requestFormat": "/completion", **COMPLETION},
        {"@requestFormat": "nope"},
        {"max_tokens": 1},
        "text",
        {"@requestFormat": "completion", "prompt": "x", "n_predict": -5},
    ]}  # fmt: skip
    r = srv.client.post("/predict", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    chat, completion, unknown, no_format, not_object, bad = r.json()["predictions"]
    direct = srv.client.post("/v1/chat/completions", json=CHAT, headers=AUTH).json()
    assert chat["choices"][0]["message"] == direct["choices"][0]["message"]  # not streamed
    want = srv.client.post("/completion", json=COMPLETION, headers=AUTH).json()["content"]
    assert completion["content"] == want
    assert "no handler registered for @requestFormat: nope" in unknown["error"]["message"]
    assert "@requestFormat" in no_format["error"]["message"]
    assert "JSON object" in not_object["error"]["message"]
    assert bad["error"]["type"] == "invalid_request_error"


def test_bad_calls_and_the_key(srv) -> None:
    assert srv.client.post("/predict", json={"instances": [{}]}).status_code == 401
    for body, word in [({"x": 1}, "instances"), ([1], "JSON object"),
                       ({"instances": [{}] * 129}, "maximum size of 128")]:  # fmt: skip
        r = srv.client.post("/predict", json=body, headers=AUTH)
        assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
    assert srv.client.get("/ping", headers=AUTH).json() == srv.client.get("/health").json()


def test_a_client_that_leaves_cancels_its_instances(srv) -> None:
    """The instances run as in-process requests: when the `/predict` client disconnects,
    they see it as a direct client's request would, and stop generating."""
    inst = {"@requestFormat": "completion", "prompt": "the", "n_predict": 240}
    body = json.dumps({"instances": [{**inst, "ignore_eos": True, "id_slot": 1}]})
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body.encode()
        )
        deadline = time.monotonic() + 10
        while not srv.client.get("/slots", headers=AUTH).json()[1]["is_processing"]:
            assert time.monotonic() < deadline
    deadline = time.monotonic() + 10
    while (slot := srv.client.get("/slots", headers=AUTH).json()[1])["is_processing"]:
        assert time.monotonic() < deadline, "the instance went on after its client left"
        time.sleep(0.02)
    assert slot["n_tokens"] < 200  # stopped early: cancelled, not completed
