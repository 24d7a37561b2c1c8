"""The HTTP ingress of `loraserve ray`: every request of the loraserve API comes here
(Ray Serve's proxy on `--host/--port`) and leaves by one of two paths.

- Global ones go to every replica through the coordinator: `POST /lora-adapters`,
  `/lora-adapters/load`, `/lora-adapters/unload` (logged writes, acknowledged once every
  replica applied them), `GET /lora-adapters` (one ordered snapshot), `GET /metrics`
  (merged, a `replica` label per sample) and `GET /health` (ok only when every replica is).
- Every other request goes to one replica: Ray Serve's handle with the request's routing
  key as its multiplexed model id (`routing.RouteTable.key`), so `routing.AffinityRouter`
  sends a mix where its KV is warm. The answer streams back as the replica's app sent it.

Before anything is read or forwarded, `guard.IngressGuard` checks the API key and the body
size (a refused request reaches neither the coordinator's log nor a replica; its body is
never parsed). Every forwarded answer carries `X-Loraserve-Replica`. A replica that dies
while it serves a request answers it with a 503 (or, once a stream has begun, a last SSE
event carrying the 503 error), never a hang; Ray Serve replaces the replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from loraserve.cluster import merge
from loraserve.cluster.asgi_host import HttpAnswer, HttpCall
from loraserve.cluster.guard import BodyTooLarge, IngressGuard
from loraserve.cluster.replica import REPLICA_MESSAGE
from loraserve.cluster.routing import RouteTable
from loraserve.server.errors import unavailable

log = logging.getLogger("loraserve.cluster")
GLOBAL_WRITES = {"/lora-adapters", "/lora-adapters/load", "/lora-adapters/unload"}
REPLICA_GONE = (RayActorError, ActorUnavailableError)


def _died(replica: str) -> str:
    return (
        f"replica {replica} stopped while serving this request (Ray Serve replaces it); "
        "send the request again"
    )


class Ingress:
    """Ray Serve's ingress deployment of `loraserve ray` (one replica, no CPU of its own)."""

    def __init__(
        self,
        replicas: DeploymentHandle,
        coordinator: str,
        namespace: str,
        argv: Sequence[str] = (),
    ) -> None:
        """``argv``: the replicas' `loraserve serve` flags (their API keys guard this door)."""
        self.guard = IngressGuard.from_argv(argv)
        self.replicas = replicas
        self.coordinator = ray.get_actor(coordinator, namespace=namespace)
        self.version, table = ray.get(self.coordinator.table_after.remote(0, 0.0))
        self.table = RouteTable(table)
        self._watch: asyncio.Task[None] | None = None

    async def _follow_table(self) -> None:
        """Keep the routing table at the coordinator's (it changes after global writes)."""
        while True:
            try:
                self._set_table(*await self.coordinator.table_after.remote(self.version))
            except REPLICA_GONE:
                await asyncio.sleep(1.0)

    def _set_table(self, version: int, table: list[dict[str, Any]]) -> None:
        if version != self.version:
            self.version, self.table = version, RouteTable(table)

    async def __call__(self, request: Request) -> Response:
        """Answer one HTTP request of the loraserve API."""
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._follow_table())
        refused = self.guard.refuse(request)
        if refused is not None:
            return refused
        try:
            body = await self.guard.read_body(request)
        except BodyTooLarge:
            return self.guard.too_big().response()
        path = request.url.path
        full = f"{path}?{request.url.query}" if request.url.query else path
        call = HttpCall(request.method, full, list(request.headers.items()), body)
        if call.method == "POST" and path in GLOBAL_WRITES:
            answers = await self.coordinator.broadcast.remote(call, "log")
            self._set_table(*await self.coordinator.table_after.remote(self.version, 0.0))
            return merge.same(answers)
        if call.method == "GET" and path == "/lora-adapters":
            return merge.same(await self.coordinator.broadcast.remote(call, "ordered"))
        if call.method == "GET" and path == "/metrics":
            return merge.metrics(await self.coordinator.broadcast.remote(call))
        if call.method == "GET" and path == "/health":
            await self.coordinator.sweep.remote()
            wanted, _ = await self.coordinator.status.remote()
            return merge.health(await self.coordinator.broadcast.remote(call), wanted)
        return await self._forward(call)

    async def _forward(self, call: HttpCall) -> Response:
        """Send ``call`` to the replica its routing key picks; stream its answer back."""
        key = self.table.key(call.body) if call.method == "POST" else ""
        stream = self.replicas.options(stream=True, multiplexed_model_id=key).handle.remote(call)
        replica = "unknown"
        try:
            first = await stream.__anext__()
            assert first["type"] == REPLICA_MESSAGE, first
            replica = first["replica"]
            start = await stream.__anext__()
            chunk = await stream.__anext__() if start["type"] == "http.response.start" else {}
        except REPLICA_GONE:
            return merge.error(unavailable(_died(replica)), replica)
        except StopAsyncIteration:
            return merge.error(unavailable(f"replica {replica} gave no answer"), replica)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", [])]
        body = chunk.get("body", b"")
        if not chunk.get("more_body", False):
            return merge.response(HttpAnswer(start["status"], headers, body), replica)
        sse = any(k.lower() == "content-type" and "event-stream" in v for k, v in headers)

        async def rest() -> AsyncIterator[bytes]:
            yield body
            try:
                async for message in stream:
                    if message["type"] == "http.response.body" and message.get("body"):
                        yield message["body"]
            except REPLICA_GONE:
                log.warning("replica %s died during a stream", replica)
                if sse:
                    err = json.dumps(unavailable(_died(replica)).body())
                    yield f"data: {err}\n\n".encode()

        out = StreamingResponse(rest(), status_code=start["status"])
        out.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in headers
            if k.lower() != "content-length"
        ] + [(merge.REPLICA_HEADER.lower().encode(), replica.encode("latin-1"))]
        return out
