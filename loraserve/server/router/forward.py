"""The router's forwarding (`Forward`): every API route it does not answer itself runs
through the engine of the model the request names, as `router.app` describes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fastapi import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from loraserve.server.errors import ApiError
from loraserve.server.router.rename import renaming_send

if TYPE_CHECKING:
    from loraserve.server.router.app import Router

FORWARDED_METHODS = ["GET", "POST", "DELETE"]


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


class Forward:
    """ASGI endpoint of every forwarded route: validate the model, load it if allowed, and
    run the request through its engine's app with the preset's settings in the body."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._forward(scope, receive, send)
        except ApiError as e:
            await e.response()(scope, receive, send)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        r = self.router
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        raw = b""
        body: Any = None
        if scope["method"] == "POST":
            raw = await _read_body(receive)
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                raise _bad("malformed JSON in the request body") from None
            name = body.get("model") if isinstance(body, dict) else None
            name = name if isinstance(name, str) else ""
        else:
            name = query.get("model", [""])[0]
        autoload = query.get("autoload", [None])[0]
        load = r.cfg.models_autoload if autoload is None else autoload in ("true", "1")
        if not name and len(r.catalog) == 1:  # ours: the one model (router.app)
            name = next(iter(r.catalog))
        if not name:
            raise _bad("model name is missing from the request")
        preset = r.find(name)
        if preset is None:
            raise _bad(f"model '{name}' not found")
        if preset.key is None:
            raise ApiError(500, "server_error", f"model name={preset.name} failed to load")
        eng = r.pool.engine(preset.key)
        if not load and not eng.running:
            raise _bad("model is not loaded")
        try:
            await r.pool.ready(preset.key)
        except RuntimeError:
            raise ApiError(
                500, "server_error", f"model name={preset.name} failed to load"
            ) from None
        if isinstance(body, dict):
            raw = json.dumps(preset.inject(body)).encode()
        headers = [
            (k, v)
            for k, v in scope.get("headers", [])
            if k.lower() not in (b"origin", b"content-length")  # CORS is the router's
        ]
        headers.append((b"content-length", str(len(raw)).encode()))
        inner = {**scope, "headers": headers}
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        own = preset.key.alias[0] if preset.key.alias else preset.name
        async with eng.use() as app:
            await app(inner, replay, renaming_send(send, own, preset.name))


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _model_field(raw: bytes) -> str:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        raise _bad("malformed JSON in the request body") from None
    name = body.get("model") if isinstance(body, dict) else None
    return name if isinstance(name, str) else ""


async def _forwarded(forward: Forward, request: Request) -> Any:
    """Run a GET that names a model through `forward`, collecting its answer."""
    status, headers, chunks = 200, [], []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], message.get("headers", [])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await forward(request.scope, request.receive, send)
    kept = {k.decode(): v.decode() for k, v in headers if k.lower() != b"content-length"}
    return Response(b"".join(chunks), status_code=status, headers=kept)
