"""A router under uvicorn in a thread, and the small calls the router tests share."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from httpx import Response
from starlette.applications import Starlette

from loraserve.server.app import HTTP_IMPL
from loraserve.server.config.args import parse_server_args
from loraserve.server.router.app import create_router_app
from tests.server_util import free_socket

PROMPT = "hello world, the router"


@contextmanager
def router_app(args: list[str]) -> Iterator[tuple[httpx.Client, Starlette]]:
    """A router (`create_router_app` under uvicorn in a thread): a client and the app."""
    app = create_router_app(parse_server_args(["-t", "1", *args]))
    sock = free_socket()
    server = uvicorn.Server(
        uvicorn.Config(app, http=HTTP_IMPL, log_level="warning", timeout_graceful_shutdown=2)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=60)
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "router did not start"
            time.sleep(0.01)
        yield client, app
    finally:
        client.close()
        server.should_exit = True
        thread.join(15)
        sock.close()


@contextmanager
def router(args: list[str]) -> Iterator[tuple[httpx.Client, object]]:
    """A router as `router_app` starts it: a client and the router's state."""
    with router_app(args) as (client, app):
        yield client, app.state.router


def status(c: httpx.Client, name: str) -> dict:
    items = {m["id"]: m for m in c.get("/models").json()["data"]}
    return items[name]["status"]


def wait_status(c: httpx.Client, name: str, want: str) -> dict:
    deadline = time.monotonic() + 60
    while (s := status(c, name))["value"] != want or s.get("failed") and want == "loaded":
        assert time.monotonic() < deadline, s
        time.sleep(0.02)
    return s


def error(r: httpx.Response, code: int, type_: str, message: str) -> None:
    assert r.status_code == code, r.text
    assert r.json() == {"error": {"code": code, "message": message, "type": type_}}


def complete(c: httpx.Client, model: str, path: str = "/completion", **kw: object) -> Response:
    body = {"model": model, "prompt": PROMPT, "n_predict": 4, "temperature": 0, **kw}
    return c.post(path, json={k: v for k, v in body.items() if v is not None})
