"""The default CORS policy keeps web pages from driving the server (issue 31 item 4): no
credentials from any origin, no empty `Access-Control-Allow-Origin`, and a state-changing
request a browser sends cross-site without a preflight (a form, text or bodyless POST: the
"simple" requests of the Fetch standard) is a 415 before any handler runs, so it generates
nothing, loads no adapter and saves or erases no slot. JSON requests, the server's own
pages, and clients that send no `Origin` (curl, SDKs) are served as before."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.server_util import Served, serve_in_thread

EVIL = "http://evil.example"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[Served]:
    slots = tmp_path_factory.mktemp("cors-slots")
    with serve_in_thread(["-np", "1", "-c", "256", "--slot-save-path", str(slots)]) as s:
        yield s


def test_no_credentials_from_any_origin(srv: Served) -> None:
    for flags in ([], ["--cors-credentials"]):
        with serve_in_thread([*flags, "-np", "1", "-c", "256"]) as s:
            r = s.client.options("/completion", headers={"Origin": EVIL, **PREFLIGHT})
            assert r.headers["access-control-allow-credentials"] == "false", flags
    listed = ["--cors-origins", "https://app.example", "--cors-credentials", "-np", "1"]
    with serve_in_thread(listed) as s:  # a named origin may have them
        r = s.client.options("/completion", headers={"Origin": "https://app.example", **PREFLIGHT})
        assert r.headers["access-control-allow-credentials"] == "true"


def test_no_empty_allow_origin_header(srv: Served) -> None:
    for r in (srv.client.get("/health"), srv.client.get("/props")):
        assert r.headers.get("access-control-allow-origin") == "*"
    r = srv.client.get("/health", headers={"Origin": EVIL})
    assert r.headers["access-control-allow-origin"] == EVIL


SIMPLE = [  # what a page can send cross-site without a preflight
    ("/completion", {"content": '{"prompt": "x", "n_predict": 1}'}, "text/plain"),
    ("/completion", {"data": {"prompt": "x"}}, "application/x-www-form-urlencoded"),
    ("/slots/0?action=erase", {}, None),
    ("/slots/0?action=save", {"content": '{"filename": "s.bin"}'}, "text/plain"),
    ("/lora-adapters", {"content": "[]"}, "text/plain;charset=UTF-8"),
]


@pytest.mark.parametrize("path,body,kind", SIMPLE, ids=[p for p, _, _ in SIMPLE])
def test_cross_site_simple_requests_change_nothing(srv: Served, path, body, kind) -> None:
    engine = srv.app.state.server.engine
    before = engine.core.n_forward
    headers = {"Origin": EVIL, **({"Content-Type": kind} if kind else {})}
    r = srv.client.post(path, headers=headers, **body)
    assert r.status_code == 415, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "application/json" in err["message"]
    assert r.headers["access-control-allow-origin"] == EVIL  # the page may read the refusal
    assert engine.core.n_forward == before  # nothing ran
    assert os.listdir(srv.app.state.server.cfg.slot_save_path) == []  # no slot file saved


def test_json_and_same_site_and_originless_requests_are_served(srv: Served) -> None:
    body = {"prompt": "the", "n_predict": 1}
    assert srv.client.post("/completion", json=body, headers={"Origin": EVIL}).status_code == 200
    own = srv.url  # the web UI's page: same host
    text = {"Content-Type": "text/plain", "Origin": own}
    r = srv.client.post("/completion", content='{"prompt": "a", "n_predict": 1}', headers=text)
    assert r.status_code == 200
    r = srv.client.post(
        "/completion",
        content='{"prompt": "a", "n_predict": 1}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},  # curl -d, no Origin
    )
    assert r.status_code == 200
    assert srv.client.post("/slots/0?action=erase").status_code == 200  # no Origin
    assert (
        srv.client.post(
            "/completion", content=b'{"prompt": "a", "n_predict": 1}', headers={"Origin": "null"}
        ).status_code
        == 415
    )
