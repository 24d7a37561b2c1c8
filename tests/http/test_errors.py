"""Bad inputs get the contract's error body with a 4xx, and the server keeps serving."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from tests.server_util import serve_in_thread

LONG = "the of and " * 200


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    slots = tmp_path_factory.mktemp("slots")
    with serve_in_thread(["-np", "2", "-c", "512", "--slot-save-path", str(slots)]) as s:
        yield s


BAD = [
    # (method, path, raw body or JSON, status, error type, words in the message)
    ("POST", "/completion", b"{bad json", 400, "invalid_request_error", "JSON"),
    ("POST", "/completion", b"", 400, "invalid_request_error", "body"),
    ("POST", "/completion", [1, 2], 400, "invalid_request_error", "object"),
    ("POST", "/completion", {}, 400, "invalid_request_error", "prompt"),
    ("POST", "/completion", {"prompt": 5}, 400, "invalid_request_error", "prompt"),
    (
        "POST",
        "/completion",
        {"prompt": "a", "n_predict": "5"},
        400,
        "invalid_request_error",
        "n_predict",
    ),
    (
        "POST",
        "/completion",
        {"prompt": "a", "temperature": "hot"},
        400,
        "invalid_request_error",
        "temperature",
    ),
    ("POST", "/completion", {"prompt": "a", "stream": 1}, 400, "invalid_request_error", "stream"),
    ("POST", "/completion", {"prompt": "a", "top_p": 7}, 400, "invalid_request_error", "top_p"),
    (
        "POST",
        "/completion",
        {"prompt": "a", "n_predict": -2},  # 10**6 runs until the context is full (test_limits)
        400,
        "invalid_request_error",
        "n_predict",
    ),
    (
        "POST",
        "/completion",
        {"prompt": "a", "n_predict": 10**12},
        400,
        "invalid_request_error",
        "n_predict",
    ),
    ("POST", "/completion", {"prompt": "a", "id_slot": 7}, 400, "invalid_request_error", "id_slot"),
    (
        "POST",
        "/completion",
        {"prompt": "a", "lora": [{"id": 99, "scale": 1}]},
        400,
        "invalid_request_error",
        "lora",
    ),
    (
        "POST",
        "/completion",
        {"prompt": "a", "lora": [{"id": "x", "scale": 1}]},
        400,
        "invalid_request_error",
        "lora",
    ),
    ("POST", "/completion", {"prompt": [1, 99999]}, 400, "invalid_request_error", "token"),
    ("POST", "/completion", {"prompt": []}, 400, "invalid_request_error", "prompt"),
    (
        "POST",
        "/completion",
        {"prompt": "a", "logit_bias": [[99999, 1]]},
        400,
        "invalid_request_error",
        "logit_bias",
    ),
    (
        "POST",
        "/completion",
        {"prompt": "a", "stop": ["x"] * 99},
        400,
        "invalid_request_error",
        "stop",
    ),
    (
        "POST",
        "/completion",
        {"prompt": "a", "n_probs": 10**6},
        400,
        "invalid_request_error",
        "n_probs",
    ),
    (
        "POST",
        "/completion",
        {"prompt": "a", "grammar": "root ::= x"},
        400,
        "invalid_request_error",
        "grammar",
    ),
    ("POST", "/completion", {"prompt": LONG}, 400, "exceed_context_size_error", "context"),
    ("POST", "/v1/completions", {"prompt": LONG}, 400, "exceed_context_size_error", "context"),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, "invalid_request_error", "messages"),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"content": "x"}]},
        400,
        "invalid_request_error",
        "role",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": LONG}]},
        400,
        "exceed_context_size_error",
        "context",
    ),
    ("POST", "/v1/completions", {"prompt": "a", "n": 3}, 400, "invalid_request_error", "n"),
    ("POST", "/tokenize", {"content": 5}, 400, "invalid_request_error", "content"),
    ("POST", "/tokenize", {"content": [1, 99999]}, 400, "invalid_request_error", "vocabulary"),
    ("POST", "/detokenize", {"tokens": [1, 99999]}, 400, "invalid_request_error", "tokens"),
    ("POST", "/detokenize", {"tokens": "x"}, 400, "invalid_request_error", "tokens"),
    ("POST", "/apply-template", {"messages": 3}, 400, "invalid_request_error", "messages"),
    ("POST", "/lora-adapters", {"id": 0}, 400, "invalid_request_error", "array"),
    ("POST", "/lora-adapters", [{"id": 42, "scale": 1}], 400, "invalid_request_error", "42"),
    ("POST", "/lora-adapters", [{"id": 0, "scale": "big"}], 400, "invalid_request_error", "scale"),
    ("POST", "/slots/9?action=erase", None, 400, "invalid_request_error", "slot"),
    ("POST", "/slots/-1?action=erase", None, 400, "invalid_request_error", "slot"),
    ("POST", "/slots/abc?action=erase", None, 400, "invalid_request_error", "id_slot"),
    ("POST", "/slots/0?action=explode", None, 400, "invalid_request_error", "action"),
    (
        "POST",
        "/slots/0?action=save",
        {"filename": "../x"},
        400,
        "invalid_request_error",
        "filename",
    ),
    ("POST", "/slots/0?action=save", {"filename": 3}, 400, "invalid_request_error", "filename"),
    (
        "POST",
        "/slots/0?action=restore",
        {"filename": "missing.bin"},
        404,
        "not_found_error",
        "missing",
    ),
    ("GET", "/no-such-endpoint", None, 404, "not_found_error", "Not Found"),
    ("GET", "/completion", None, 405, "invalid_request_error", "GET"),
]


@pytest.mark.parametrize(
    "method,path,body,status,kind,word", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)]
)
def test_bad_input_is_a_contract_4xx(srv, method, path, body, status, kind, word) -> None:
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    if body is None:
        kw = {}
    r = srv.client.request(method, path, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] == kind
    assert word.lower() in err["message"].lower(), err["message"]
    if kind == "exceed_context_size_error":
        assert err["n_ctx"] == 256 and err["n_prompt_tokens"] > 256


def test_server_keeps_serving_everyone_during_bad_requests(srv) -> None:
    good: list[int] = []

    def worker() -> None:
        for _ in range(3):
            r = srv.client.post("/completion", json={"prompt": "the", "n_predict": 8})
            good.append(r.status_code)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for method, path, body, status, *_ in BAD[:20]:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        assert srv.client.request(method, path, **kw).status_code == status
    for t in threads:
        t.join()
    assert good == [200] * 6
    assert srv.client.get("/health").status_code == 200


def test_declared_oversized_body_is_413(srv) -> None:
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 900000000\r\n\r\n{"
        )
        raw = b""
        while b'"}}' not in raw and (chunk := s.recv(4096)):
            raw += chunk
    head, _, body = raw.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413"), head
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert srv.client.get("/health").status_code == 200
