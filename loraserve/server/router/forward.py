"""The router's forwarding (`Forward`): every API route it does not answer itself runs
through the engine of the model the request names, as `router.app` describes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from loraserve.server.errors import ApiError
from loraserve.server.router.rename import renaming_send

if TYPE_CHECKING:
    from loraserve.server.router.app import Router
    from loraserve.server.router.engine import Engine
    from loraserve.server.router.presets import Preset

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
        raw = await _read_body(receive)  # (a GET's: empty) next comes the disconnect
        body: Any = None
        if scope["method"] == "POST":
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
        if not name:
            name = r.implicit()  # the only model, or ours: the default one (router.app)
        if not name:
            raise _bad("model name is missing from the request")
        preset = r.find(name)
        if preset is None:
            raise _bad(f"model '{name}' not found")
        if preset.key is None and preset.hf is not None:  # its file not in the cache yet
            if not load:
                raise _bad("model is not loaded")
            preset = await r.pending.ready(preset)  # downloaded (router.pending)
        if preset.key is None:
            raise ApiError(500, "server_error", f"model name={preset.name} failed to load")
        eng = r.pool.engine(preset.key)
        if not load and not eng.running:
            raise _bad("model is not loaded")
        # waiting for the engine, a request keeps it from eviction and its queued load alive;
        # a client that leaves meanwhile is seen (its next message) and stops waiting
        watch = asyncio.ensure_future(receive())
        eng.waiting += 1
        counted = True

        def stop_waiting() -> None:
            nonlocal counted
            if counted:
                counted = False
                eng.waiting -= 1

        try:
            ready = asyncio.ensure_future(r.pool.ready(preset.key))
            await asyncio.wait({ready, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():
                ready.cancel()
                return  # the client left: nobody to answer
            if ready.exception() is not None or eng.app is None:
                raise ApiError(500, "server_error", f"model name={preset.name} failed to load")
            await self._serve(scope, send, preset, eng, raw, body, (receive, watch, stop_waiting))
        finally:
            stop_waiting()
            if not watch.done():
                watch.cancel()

    async def _serve(
        self,
        scope: Scope,
        send: Send,
        preset: Preset,
        eng: Engine,
        raw: bytes,
        body: Any,
        client: tuple[Receive, asyncio.Future[Message], Callable[[], None]],
    ) -> None:
        """Run the request through `eng`'s app (loaded). `client`: its `receive`, its next
        message (already asked for) and what takes it out of `eng.waiting` once it is
        counted busy."""
        receive, watch, stop_waiting = client
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
        pending: asyncio.Future[Message] | None = watch

        async def replay() -> Message:
            nonlocal sent, pending
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            if pending is not None:
                waited, pending = pending, None
                return await waited
            return await receive()

        own = preset.key.alias[0] if preset.key is not None and preset.key.alias else preset.name
        async with eng.use() as app:
            stop_waiting()
            if self.router.pool.fake_delay_s:  # llama-server's debug delay, counted busy
                await asyncio.sleep(self.router.pool.fake_delay_s)
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
