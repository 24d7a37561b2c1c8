"""Every state-changing route of every API surface refuses a web page's cross-site write
that a browser sends without a preflight (issue 31 item 4): native, OpenAI, Anthropic,
Responses, admin, slots, adapter loads, tools and the router's model management. The
routes are read from the apps' own route tables (plus `/tools` and `/cors-proxy`, which a
middleware answers), so a route added later is covered without editing this list. The
default policy's preflight answers never allow credentials on any of them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.http.router_util import router_app
from tests.server_util import peft_folder, serve_in_thread, tiny_model_path

EVIL = "http://evil.example"
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MIDDLEWARE_ROUTES = {("POST", "/tools"), ("POST", "/cors-proxy")}
SIMPLE_KINDS = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]


def writes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every state-changing route, path parameters filled in."""
    out = set(MIDDLEWARE_ROUTES)
    todo: list[Any] = list(app.routes)
    while todo:
        route = todo.pop()
        inner = getattr(route, "original_router", None)  # FastAPI's included routers
        if inner is not None:
            todo += inner.routes
        for method in getattr(route, "methods", None) or ():
            if method in WRITES:
                out.add((method, re.sub(r"\{[^}]+\}", "x", route.path)))
    return sorted(out)


def refused_everywhere(client: httpx.Client, routes: list[tuple[str, str]]) -> None:
    """Each route, sent cross-site with each simple content type (and none), is a 415 whose
    message names the content type it wants; its preflight never allows credentials."""
    assert len(routes) > len(MIDDLEWARE_ROUTES)
    for i, (method, path) in enumerate(routes):
        kind = SIMPLE_KINDS[i % len(SIMPLE_KINDS)]
        headers = {"Origin": EVIL, **({"Content-Type": kind} if kind else {})}
        r = client.request(method, path, headers=headers, content=b'{"prompt": "x"}')
        assert r.status_code == 415, (method, path, r.status_code, r.text)
        assert "application/json" in r.json()["error"]["message"], (method, path)
        pre = {"Origin": EVIL, "Access-Control-Request-Method": method}
        r = client.options(path, headers=pre)
        assert r.status_code == 200
        assert r.headers["access-control-allow-credentials"] == "false", (method, path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    loras = tmp_path_factory.mktemp("cors-loras")
    peft_folder(loras / "a", 1)
    return loras, tmp_path_factory.mktemp("cors-slots")


def test_every_server_route_refuses_unpreflighted_writes(folders: tuple[Path, Path]) -> None:
    loras, slots = folders
    flags = ["-np", "1", "-c", "256", "--slot-save-path", str(slots), "--lora-dir", str(loras)]
    for extra in ([], ["--cors-credentials"]):
        with serve_in_thread([*flags, *extra]) as srv:
            routes = writes(srv.app)
            surfaces = ("/completion", "/v1/chat/completions", "/v1/messages", "/v1/responses")
            for path in (*surfaces, "/slots/x", "/lora-adapters/load", "/tokenize"):
                assert ("POST", path) in routes, path  # the surfaces are all in the table
            engine = srv.app.state.server.engine
            before = (engine.core.n_forward, len(engine.core.adapters.list()))
            refused_everywhere(srv.client, routes)
            assert (engine.core.n_forward, len(engine.core.adapters.list())) == before
            assert list(slots.iterdir()) == []  # no slot saved
            r = srv.client.post(  # the same request as JSON: past the CORS layer
                "/completion", json={"prompt": "x", "n_predict": 1}, headers={"Origin": EVIL}
            )
            assert r.status_code == 200 and "access-control-allow-credentials" not in r.headers


def test_every_router_route_refuses_unpreflighted_writes(tmp_path: Path) -> None:
    shutil.copy(tiny_model_path(), tmp_path / "tiny.gguf")
    with router_app(["--models-dir", str(tmp_path), "--models-max", "1"]) as (c, app):
        routes = writes(app)
        assert ("POST", "/models/load") in routes and ("POST", "/models/unload") in routes
        refused_everywhere(c, routes)
        models = c.get("/models").json()["data"]
        assert models and {m["status"]["value"] for m in models} == {"unloaded"}  # none loaded
