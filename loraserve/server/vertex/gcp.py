"""Vertex AI's prediction protocol, as llama-server serves it when `AIP_MODE=PREDICTION`:
`POST $AIP_PREDICT_ROUTE` (default `/predict`) takes `{"instances": [...]}`, each instance
one request body with an `@requestFormat` naming its endpoint (the camelCase of a POST path,
`chatCompletions` for `/v1/chat/completions`, or the path itself), and answers
`{"predictions": [...]}`: each instance's JSON answer (or its error object) in order, the
instances run concurrently through the app itself, so each is batched, authenticated and
validated as if it came alone. `AIP_HEALTH_ROUTE` adds an alias of `/health` and
`AIP_HTTP_PORT` replaces `--port` (llama-server's server-http.cpp).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request as HttpRequest
from starlette.routing import Route

from loraserve.server.errors import JsonResponse, error_body, invalid_request

if TYPE_CHECKING:  # FastAPI is imported where used: `enabled` is asked by the router too
    from fastapi import FastAPI

MAX_INSTANCES = 128  # llama-server's limit
FORWARDED_HEADERS = (b"authorization", b"x-api-key")


def enabled() -> bool:
    """Whether the prediction protocol is on (`AIP_MODE=PREDICTION`)."""
    return os.environ.get("AIP_MODE", "") == "PREDICTION"


def port_override() -> int | None:
    """`AIP_HTTP_PORT` when the protocol is on (it replaces `--port`), else None."""
    value = os.environ.get("AIP_HTTP_PORT") if enabled() else None
    return int(value) if value else None


def format_of(path: str) -> str:
    """The camelCase `@requestFormat` of a path: `/v1/chat/completions` -> `chatCompletions`,
    `/apply-template` -> `applyTemplate` (llama-server's path_to_gcp_format)."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = s.lstrip("/").split(":", 1)[0].split("{", 1)[0]
    out, cap = [], False
    for ch in s:
        if ch in "/-_":
            cap = True
        else:
            out.append(ch.upper() if cap else ch)
            cap = False
    return "".join(out)


def install(app: FastAPI) -> None:
    """Add the predict route (and the health alias) to `app` when the protocol is on."""
    if not enabled():
        return
    from fastapi import APIRouter

    predict_path = os.environ.get("AIP_PREDICT_ROUTE") or "/predict"
    router = APIRouter()
    health = os.environ.get("AIP_HEALTH_ROUTE")
    aliases: dict[str, str] = {}
    for path, methods, endpoint in _routes(app.routes):
        if health and path == "/health" and "GET" in methods:
            router.add_api_route(health, endpoint, methods=["GET"])
        if "POST" in methods:  # first registration wins, as llama-server's map
            aliases.setdefault(format_of(path), path)
    posts = set(aliases.values())

    async def predict(request: HttpRequest) -> JsonResponse:
        try:
            data = json.loads(await request.body())
        except ValueError as e:
            raise invalid_request(f"request body is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise invalid_request("request body must be a JSON object")
        instances = data.get("instances")
        if not isinstance(instances, list):
            raise invalid_request("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise invalid_request(f"instances array exceeds maximum size of {MAX_INSTANCES}")
        headers = [(k, v) for k, v in request.headers.raw if k.lower() in FORWARDED_HEADERS]
        gone = asyncio.Event()  # the client left: every instance's request is cancelled
        watch = asyncio.create_task(_watch_disconnect(request, gone))
        try:
            tasks = [_one(request.app, aliases, posts, headers, inst, gone) for inst in instances]
            return JsonResponse({"predictions": list(await asyncio.gather(*tasks))})
        finally:
            watch.cancel()

    router.add_api_route(predict_path, predict, methods=["POST"])
    app.include_router(router)


def _routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, set[str], Any]]:
    """(path, methods, endpoint) of every route, inside included routers too (newer
    FastAPI keeps an included router as one entry holding `original_router`)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            context = getattr(route, "include_context", None)
            yield from _routes(inner.routes, prefix + (getattr(context, "prefix", "") or ""))
        elif isinstance(route, Route):
            yield prefix + route.path, set(route.methods or ()), route.endpoint


async def _watch_disconnect(request: HttpRequest, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client disconnects (the body is already read, so the next
    ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def _one(
    app: Any,
    aliases: dict[str, str],
    posts: set[str],
    headers: list,
    instance: Any,
    gone: asyncio.Event,
) -> Any:
    """One instance's answer: its endpoint's JSON body, or an error object."""
    if not isinstance(instance, dict):
        return error_body("each instance must be a JSON object")
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return error_body("each instance must include a string @requestFormat")
    path = aliases.get(fmt) or (fmt if fmt in posts else None)
    if path is None:
        return error_body(f"no handler registered for @requestFormat: {fmt}")
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    payload["stream"] = False  # the predict route answers whole bodies only
    status, body = await _call(app, path, headers, json.dumps(payload).encode(), gone)
    try:
        return json.loads(body) if body else None
    except ValueError:
        return (
            body.decode("utf-8", "replace")
            if status < 400
            else error_body(body.decode("utf-8", "replace"), "server_error")
        )


async def _call(
    app: Any, path: str, headers: list, body: bytes, gone: asyncio.Event
) -> tuple[int, bytes]:
    """POST `body` to `path` through the ASGI app, in process: (status, body). When
    ``gone`` is set (the outer client left), the inner request sees a disconnect, so its
    generation stops as a direct request's would."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), *headers],
    }  # fmt: skip
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:  # the body is read: wait until the outer client leaves
            await gone.wait()
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), 500)
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
