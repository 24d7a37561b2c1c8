"""The Ray ingress checks the API key and the body size before it reads, parses or forwards
anything (issue 31 item 11): an unauthenticated global write never reaches the coordinator
(whose log every replica replays), an unauthenticated request's body is never parsed for its
routing key, and a body over the limit (declared, or streamed without a length) is a 413.

The ingress class runs here without a cluster: its coordinator, replica handle and routing
table are stand-ins that record what reached them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install -e '.[ray]'")

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from loraserve.cluster.asgi_host import HttpAnswer  # noqa: E402
from loraserve.cluster.guard import IngressGuard  # noqa: E402
from loraserve.cluster.ingress import Ingress  # noqa: E402
from loraserve.cluster.replica import REPLICA_MESSAGE  # noqa: E402

KEY = "ingress-key"
LIMIT = 4096


class Remote:
    """A Ray actor method stand-in: `.remote(...)` records the call, returns an awaitable."""

    def __init__(self, name: str, log: list[str], value: Any) -> None:
        self.name, self.log, self.value = name, log, value

    def remote(self, *args: Any) -> Any:
        self.log.append(self.name)

        async def result() -> Any:
            return self.value

        return result()


class Replicas:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def options(self, **kw: Any) -> Replicas:
        return self

    @property
    def handle(self) -> Replicas:
        return self

    def remote(self, call: Any) -> AsyncIterator[dict[str, Any]]:
        self.log.append("replica")

        async def stream() -> AsyncIterator[dict[str, Any]]:
            yield {"type": REPLICA_MESSAGE, "replica": "r0"}
            yield {"type": "http.response.start", "status": 200, "headers": []}
            yield {"type": "http.response.body", "body": b"{}", "more_body": False}

        return stream()


class Table:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def key(self, body: bytes) -> str:
        self.log.append("parsed")
        return ""


class Watching:
    def done(self) -> bool:
        return False


def ingress_client(log: list[str]) -> TestClient:
    ingress = object.__new__(Ingress)  # no cluster: the stand-ins record what reaches them
    ingress.guard = IngressGuard.from_argv(["-m", "x.gguf", "--api-key", KEY])
    ingress.guard.max_body = LIMIT
    answer = {"r0": HttpAnswer(200, [], b"{}")}
    ingress.coordinator = type("C", (), {})()
    for name, value in (
        ("broadcast", answer),
        ("table_after", (0, [])),
        ("sweep", None),
        ("status", (1, 1)),
    ):
        setattr(ingress.coordinator, name, Remote(name, log, value))
    ingress.version, ingress.table = 0, Table(log)
    ingress.replicas = Replicas(log)
    ingress._watch = Watching()

    async def endpoint(request: Request) -> Any:
        return await ingress(request)

    methods = ["GET", "POST"]
    return TestClient(Starlette(routes=[Route("/{path:path}", endpoint, methods=methods)]))


@pytest.fixture()
def log() -> list[str]:
    return []


@pytest.fixture()
def client(log: list[str]) -> Iterator[TestClient]:
    with ingress_client(log) as c:
        yield c


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_an_unauthenticated_global_write_reaches_nothing(client, log) -> None:
    body = {"path": "/some/adapter"}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = client.post("/lora-adapters/load", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert log == []  # not logged, not broadcast, not parsed
    assert client.post("/lora-adapters/load", json=body, headers=AUTH).status_code == 200
    assert "broadcast" in log


def test_an_unauthenticated_request_is_not_parsed(client, log) -> None:
    r = client.post("/completion", json={"prompt": "x", "model": "a"})
    assert r.status_code == 401
    assert log == []
    r = client.post("/completion", json={"prompt": "x"}, headers=AUTH)
    assert r.status_code == 200 and log == ["parsed", "replica"]


def test_public_paths_stay_open(client, log) -> None:
    client.get("/health")
    assert "sweep" in log


def test_bodies_over_the_limit_are_413(client, log) -> None:
    big = b"x" * (LIMIT + 1)
    r = client.post("/completion", content=big, headers=AUTH)
    assert r.status_code == 413 and str(LIMIT) in r.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds as it streams
        for _ in range(8):
            yield b"y" * 1024

    r = client.post("/lora-adapters", content=chunks(), headers=AUTH)
    assert r.status_code == 413
    assert log == []
    r = client.post("/completion", content=b"z" * LIMIT, headers=AUTH)
    assert r.status_code == 200  # at the limit: fine
