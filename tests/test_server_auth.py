"""API keys: every endpoint but /health and /v1/models refuses a missing or wrong key with
the contract's 401 body, and accepts a right one (Bearer or X-Api-Key, any listed key)."""

from __future__ import annotations

import pytest

from loraserve.server.auth import ApiKeyMiddleware, presented_key
from tests.server_util import serve_in_thread

MSGS = [{"role": "user", "content": "hi"}]
PROTECTED = [
    ("POST", "/completion", {"prompt": "a", "n_predict": 1}),
    ("POST", "/completions", {"prompt": "a", "n_predict": 1}),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1}),
    ("POST", "/v1/chat/completions", {"messages": MSGS, "max_tokens": 1}),
    ("POST", "/chat/completions", {"messages": MSGS, "max_tokens": 1}),
    ("GET", "/props", None),
    ("GET", "/slots", None),
    ("POST", "/slots/0?action=erase", None),
    ("GET", "/lora-adapters", None),
    ("POST", "/lora-adapters", []),
    ("POST", "/lora-adapters/load", {"path": "x.gguf"}),
    ("POST", "/lora-adapters/unload", {"id": 0}),
    ("POST", "/tokenize", {"content": "a"}),
    ("POST", "/detokenize", {"tokens": [1]}),
    ("POST", "/apply-template", {"messages": MSGS}),
    ("GET", "/metrics", None),
    ("GET", "/no-such-route", None),
]
UNAUTHORIZED = {
    "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("auth")
    (folder / "keys.txt").write_text("# operators\nkey-two\n\n")
    args = ["--api-key", "key-one", "--api-key-file", str(folder / "keys.txt"), "--metrics"]
    with serve_in_thread([*args, "--slot-save-path", str(folder)]) as s:
        yield s


@pytest.mark.parametrize("method,path,body", PROTECTED, ids=[p for _, p, _ in PROTECTED])
def test_protected_endpoint(srv, method, path, body) -> None:
    def send(headers: dict[str, str]):
        return srv.client.request(method, path, json=body, headers=headers)

    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer key-one-and-more"},
        {"Authorization": "Basic key-one"},
        {"X-Api-Key": "key-on"},
    ):
        r = send(headers)
        assert r.status_code == 401 and r.json() == UNAUTHORIZED, (headers, r.text)
    for headers in ({"Authorization": "Bearer key-one"}, {"X-Api-Key": "key-two"}):
        r = send(headers)
        assert r.status_code not in (401, 500), (headers, r.text)


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/models"])
def test_public_endpoints_need_no_key(srv, path) -> None:
    assert srv.client.get(path).status_code == 200


def test_key_parsing_and_compare() -> None:
    mw = ApiKeyMiddleware(lambda *a: None, ["k1", "k2"])  # type: ignore[arg-type]
    assert mw.valid(b"k1") and mw.valid(b"k2")
    assert not mw.valid(b"k") and not mw.valid(b"") and not mw.valid(None)
    assert presented_key([(b"authorization", b"bearer  k1 ")]) == b"k1"
    assert presented_key([(b"x-api-key", b"k2")]) == b"k2"
    assert presented_key([(b"authorization", b"Token k1")]) is None
