"""What the route modules share: the model and engine once loaded, and the bridge between
asyncio handlers and the engine thread (engine calls, per-request event streams)."""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest

from loraserve.engine.engine import Engine
from loraserve.engine.inbox import EngineBusy
from loraserve.engine.request import Event, Request, Run
from loraserve.lora.registry import BASE
from loraserve.model.loader import LoadedModel
from loraserve.server.args import ServerConfig
from loraserve.server.errors import (
    STATUS_OF_TYPE,
    ApiError,
    invalid_request,
    parse_body,
    unavailable,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
POLL_S = 0.5  # safety net: a flight re-checks its queues at least this often
BIG_BODY_BYTES = 1 << 16  # larger bodies are parsed off the event loop


class ServerState:
    """The server's one shared object (`app.state.server`).

    `engine` is None until the model is loaded (every endpoint but /health answers 503
    meanwhile). Engine state is only touched through the engine's public methods.
    """

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.model: LoadedModel | None = None
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started = time.time()
        self._wakers: dict[int, asyncio.Event] = {}
        self.flights: set[Flight] = set()
        self.listeners: list[Callable[[Run, Event], None]] = []  # added at `attach`

    def attach(self, model: LoadedModel, engine: Engine) -> None:
        """Make a started engine serve requests (called once, from the loading thread);
        `listeners` become engine listeners."""
        engine.listeners.extend([*self.listeners, self._on_event])
        self.model = model
        self.engine = engine

    def require(self) -> Engine:
        """The engine, or a 503 while the model is loading (or failed to)."""
        if self.engine is None:
            if self.load_error:
                raise unavailable(f"Model failed to load: {self.load_error}")
            raise unavailable()
        return self.engine

    @property
    def model_name(self) -> str:
        """The name clients see in `model`: the first `--alias`, else the model's file name."""
        if self.cfg.alias:
            return self.cfg.alias[0]
        if self.model is not None:
            return self.model.path.name
        return self.cfg.model or ""

    def _on_event(self, run: Run, ev: Event) -> None:
        waker = self._wakers.get(run.req.id)
        if waker is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(waker.set)

    def abort_flights(self, message: str = "the server is shutting down") -> None:
        """Event loop: end every flight now; its unfinished requests are cancelled and
        answer 503 `unavailable_error` (the end of the shutdown grace period)."""
        for flight in list(self.flights):
            flight.abort(message)

    def shutdown(self) -> None:
        """Cancel every request still in flight and stop the engine thread."""
        for flight in list(self.flights):
            flight.close()
        if self.engine is not None:
            self.engine.shutdown()


class Flight:
    """The engine requests of one HTTP request, from submission to their final events.

    Create it before the requests reach the engine (it registers their wake-ups), and
    `close` it when done: requests without a final event are cancelled then.
    """

    def __init__(self, state: ServerState, reqs: list[Request]) -> None:
        self.state = state
        self.reqs = reqs
        self.mix = BASE  # the requests' effective mix, once the engine received them
        self.finished: set[int] = set()
        self.gone = False
        self.aborted: str | None = None  # set by `abort`: the unfinished requests' error
        self._wake = asyncio.Event()
        for r in reqs:
            state._wakers[r.id] = self._wake
        state.flights.add(self)

    async def events(self, http: HttpRequest | None = None) -> AsyncIterator[tuple[int, Event]]:
        """(index, event) pairs as the engine sends them, until every request is done.

        With `http`, a client that disconnects cancels the requests and ends the stream.
        """
        watcher = asyncio.create_task(self._watch(http)) if http is not None else None
        try:
            while len(self.finished) < len(self.reqs):
                got = False
                for i, r in enumerate(self.reqs):
                    while i not in self.finished:
                        try:
                            ev = r.events.get_nowait()
                        except queue.Empty:
                            break
                        got = True
                        if ev.done:
                            self.finished.add(i)
                        yield i, ev
                if got or len(self.finished) == len(self.reqs):
                    continue
                if self.gone:
                    return
                if self.aborted is not None:
                    end = Event(done=True, error=self.aborted, error_type="unavailable_error")
                    for i in sorted(set(range(len(self.reqs))) - self.finished):
                        self.finished.add(i)
                        yield i, end
                    return
                self._wake.clear()
                if any(not r.events.empty() for r in self.reqs):
                    continue
                try:
                    await asyncio.wait_for(self._wake.wait(), POLL_S)
                except TimeoutError:
                    pass
        finally:
            if watcher is not None:
                watcher.cancel()
            self.close()

    async def _watch(self, http: HttpRequest) -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self._cancel()
        self._wake.set()

    def abort(self, message: str) -> None:
        """End the flight: cancel its unfinished requests, which then fail with `message`."""
        self.aborted = message
        self._cancel()
        self._wake.set()

    def _cancel(self) -> None:
        engine = self.state.engine
        for i, r in enumerate(self.reqs):
            if i not in self.finished and not r.cancelled:
                if engine is not None:
                    engine.cancel(r)
                else:
                    r.cancelled = True

    def close(self) -> None:
        """Cancel what has not finished and forget the wake-ups (idempotent)."""
        self._cancel()
        for r in self.reqs:
            self.state._wakers.pop(r.id, None)
        self.state.flights.discard(self)


async def wait(fut: Future[T]) -> T:
    """The result of an engine method's future; a 503 if the engine stayed busy."""
    try:
        return await asyncio.wrap_future(fut)
    except EngineBusy as e:
        raise unavailable(str(e)) from None


def body_doc(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """`openapi_extra` documenting a JSON request body of `model` (references inlined).

    Handlers still read and validate the body themselves (`errors.parse_body`), so that
    every bad body gets the contract's error answer.
    """
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(x: Any) -> Any:
        if isinstance(x, dict):
            if "$ref" in x:
                return inline(defs[x["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in x.items()}
        if isinstance(x, list):
            return [inline(v) for v in x]
        return x

    content = {"application/json": {"schema": inline(schema)}}
    return {"requestBody": {"required": required, "content": content}}


async def read_body(request: HttpRequest, model: type[M]) -> M:
    """The request body validated into `model` (`errors.parse_body`); a body nested too
    deeply for the JSON parser is a 400 too, and so is a client leaving mid-body."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise invalid_request("the client closed the connection before sending the body") from None

    def parse() -> M:
        try:
            return parse_body(model, raw)
        except RecursionError:
            raise invalid_request("Invalid JSON in request body: nested too deeply") from None

    if len(raw) > BIG_BODY_BYTES:  # parsing a large body would stall the event loop
        return await asyncio.to_thread(parse)
    return parse()


def get_state(request: HttpRequest) -> ServerState:
    """The `ServerState` of the app serving `request`."""
    return request.app.state.server


def error_of(ev: Event) -> ApiError:
    """The error answer for a request that failed inside the engine."""
    status = STATUS_OF_TYPE.get(ev.error_type, 500)
    return ApiError(status, ev.error_type, ev.error or "request failed")
