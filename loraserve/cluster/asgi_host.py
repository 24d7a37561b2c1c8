"""An ASGI app hosted in-process on its own thread and event loop, called with plain
values: `AppHost.call` sends one HTTP request through the app (its middlewares and routes,
as uvicorn would) and yields the ASGI messages it answers with.

The loraserve app binds its state to the loop its lifespan runs on (`ServerState.loop`),
so the app lives on one loop of its own whatever loop the caller (a Ray Serve replica's
methods) runs on; messages cross between the two loops thread-safely.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from fastapi import FastAPI

T = TypeVar("T")
_END = object()


@dataclass(frozen=True)
class HttpCall:
    """One HTTP request as plain values (what travels from the ingress to a replica)."""

    method: str
    path: str  # with the query string, as the client sent it: /slots/0?action=save
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def scope(self) -> dict[str, Any]:
        """The ASGI HTTP scope of this request."""
        parts = urlsplit(self.path)
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": self.method.upper(),
            "scheme": "http",
            "path": parts.path or "/",
            "raw_path": (parts.path or "/").encode(),
            "query_string": parts.query.encode(),
            "root_path": "",
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers
            ],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }


@dataclass
class HttpAnswer:
    """A whole HTTP answer: status, headers and body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


class AppHost:
    """Run `app` (lifespan entered at construction) on a daemon thread's event loop."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="loraserve-asgi")
        self._thread.daemon = True
        self._thread.start()
        self._stop = asyncio.Event()
        started: Future[None] = Future()
        self._lifespan = self.submit(self._run_lifespan(started))
        started.result(timeout=60)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run a coroutine on the app's loop (from any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def _run_lifespan(self, started: Future[None]) -> None:
        try:
            async with self.app.router.lifespan_context(self.app):
                started.set_result(None)
                await self._stop.wait()
        except BaseException as e:
            if not started.done():
                started.set_exception(e)
            raise

    def close(self, timeout: float = 15.0) -> None:
        """Leave the lifespan (the server's shutdown: the engine stops) and stop the loop."""
        self.loop.call_soon_threadsafe(self._stop.set)
        try:
            self._lifespan.result(timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

    async def call(self, request: HttpCall) -> AsyncIterator[dict[str, Any]]:
        """The ASGI messages (``http.response.start``, ``http.response.body``...) that the
        app answers `request` with, on the caller's loop. Leaving the iteration early (the
        client went away) tells the app the client disconnected."""
        caller = asyncio.get_running_loop()
        out: asyncio.Queue[Any] = asyncio.Queue()
        gone = asyncio.Event()  # on the app's loop, set when the caller stops listening

        def put(message: Any) -> None:
            caller.call_soon_threadsafe(out.put_nowait, message)

        async def run() -> None:
            sent = False

            async def receive() -> dict[str, Any]:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": request.body, "more_body": False}
                await gone.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                put(message)

            try:
                await self.app(request.scope(), receive, send)
            except BaseException as e:  # the app's error handlers answered, or it crashed
                put(e)
            finally:
                put(_END)

        task = self.submit(run())
        try:
            while (message := await out.get()) is not _END:
                if isinstance(message, BaseException):
                    raise message
                yield message
        finally:
            self.loop.call_soon_threadsafe(gone.set)
            if not task.done():
                task.cancel()

    async def answer(self, request: HttpCall) -> HttpAnswer:
        """`call`, collected into one `HttpAnswer`."""
        status, headers, body = 500, [], bytearray()
        async for message in self.call(request):
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [
                    (k.decode("latin-1"), v.decode("latin-1"))
                    for k, v in message.get("headers", [])
                ]
            elif message["type"] == "http.response.body":
                body += message.get("body", b"")
        return HttpAnswer(status, headers, bytes(body))
