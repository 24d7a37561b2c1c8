"""CORS as llama-server: preflights answer 200 before the API key is checked, every answer
carries Access-Control-Allow-Origin (echoed under the default `*`, but without credentials:
ours, `tests/http/test_cors_default.py`; only localhost origins under `--cors-origins
localhost`, the list as given otherwise)."""

from __future__ import annotations

import pytest

from loraserve.server.cors import CorsPolicy, origin_is_localhost
from tests.server_util import serve_in_thread

KEY = "sk-secret"
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "Authorization",
}


@pytest.fixture(scope="module")
def srv():
    with serve_in_thread(["--api-key", KEY, "-np", "1", "-c", "256"]) as s:
        yield s


@pytest.mark.parametrize(
    "origin,header,value",
    [
        ("localhost", "access-control-allow-origin", "localhost"),
        ("web.mydomain.fr", "access-control-allow-origin", "web.mydomain.fr"),
        ("origin", "access-control-allow-credentials", "false"),  # ours: never from any origin
        ("web.mydomain.fr", "access-control-allow-methods", "GET, POST, DELETE, OPTIONS"),
        ("web.mydomain.fr", "access-control-allow-headers", "*"),
    ],
)
def test_preflight_under_api_key_is_200(srv, origin, header, value) -> None:
    for path in ("/completions", "/v1/chat/completions", "/no/such/path"):
        r = srv.client.options(path, headers={"Origin": origin, **PREFLIGHT})
        assert r.status_code == 200 and r.headers[header] == value
        names = {name for name, _ in r.headers.raw}  # written as llama-server writes them
        assert b"Access-Control-Allow-Origin" in names and b"Access-Control-Allow-Methods" in names


def test_every_answer_carries_the_origin(srv) -> None:
    r = srv.client.post("/completion", json={"prompt": "a"}, headers={"Origin": "http://x.org"})
    assert r.status_code == 401
    assert r.headers["access-control-allow-origin"] == "http://x.org"
    r = srv.client.get("/health", headers={"Origin": "http://x.org"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://x.org"
    ok = srv.client.post(
        "/completion",
        json={"prompt": "a", "n_predict": 1},
        headers={"Origin": "http://y.org", "Authorization": f"Bearer {KEY}"},
    )
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://y.org"


def test_localhost_policy_over_http() -> None:
    with serve_in_thread(["--cors-origins", "localhost", "-np", "1", "-c", "256"]) as s:
        for origin in ("http://localhost:8080", "http://127.0.0.1", "http://[::1]:3000"):
            r = s.client.options("/completions", headers={"Origin": origin, **PREFLIGHT})
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        for origin in ("http://evil.com", "http://localhost.evil.com", "http://notlocalhost"):
            r = s.client.options("/completions", headers={"Origin": origin, **PREFLIGHT})
            assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_policy_rules() -> None:
    assert CorsPolicy().allow_origin("http://a") == "http://a"
    assert CorsPolicy(credentials=False).allow_origin("http://a") == "*"
    assert CorsPolicy(origins="https://a.org,https://b.org").allow_origin("x") == (
        "https://a.org,https://b.org"
    )
    assert CorsPolicy(origins="localhost").allow_origin("") is None
    assert not origin_is_localhost("http://[bad")
    headers = dict(CorsPolicy(credentials=False).headers_for("o", preflight=True))
    assert headers[b"Access-Control-Allow-Credentials"] == b"false"
