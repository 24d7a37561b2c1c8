"""The bridge between asyncio handlers and the engine thread: awaiting an engine method's
future (`wait`), and following one HTTP request's engine requests (`Flight`) from their
submission to their final events.

The engine thread wakes a flight through `Flights.listener` (an engine listener); the
flight then reads its requests' event queues on the event loop. A waiting flight is only
ever woken by an event (no polling): every event is put on its queue before the wake-up, and
the flight looks at its queues after clearing its wake-up flag and before waiting on it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import TypeVar

from starlette.requests import Request as HttpRequest

from loraserve.engine.engine import Engine
from loraserve.engine.inbox import EngineBusy
from loraserve.engine.request import Event, Request, Run
from loraserve.lora.registry import BASE
from loraserve.server.errors import current_endpoint, unavailable

log = logging.getLogger("loraserve.server")

T = TypeVar("T")


async def wait(fut: Future[T]) -> T:
    """The result of an engine method's future; a 503 if the engine stayed busy."""
    try:
        return await asyncio.wrap_future(fut)
    except EngineBusy as e:
        raise unavailable(str(e)) from None


class Flights:
    """Every flight in progress, by the ids of its engine requests."""

    def __init__(self) -> None:
        self._by_request: dict[int, Flight] = {}
        self._open: set[Flight] = set()

    def __len__(self) -> int:
        """How many flights are in progress."""
        return len(self._open)

    def start(self, engine: Engine, requests: list[Request]) -> Flight:
        """Event loop: follow `requests` (just submitted) until `Flight.close`."""
        flight = Flight(self, engine, requests)
        for r in requests:
            self._by_request[r.id] = flight
        self._open.add(flight)
        return flight

    def listener(self, run: Run, ev: Event) -> None:
        """Engine thread: wake the flight that follows `run`'s request."""
        flight = self._by_request.get(run.req.id)
        if flight is not None:
            flight.wake_threadsafe()

    def abort_all(self, message: str) -> None:
        """Event loop: end every flight now; unfinished requests fail with `message`."""
        for flight in list(self._open):
            flight.abort(message)

    def close_all(self) -> None:
        """Cancel every request still in flight."""
        for flight in list(self._open):
            flight.close()

    def _forget(self, flight: Flight) -> None:
        for r in flight.requests:
            self._by_request.pop(r.id, None)
        self._open.discard(flight)


class Flight:
    """The engine requests of one HTTP request, from submission to their final events.

    `close` it when done (`events` does): requests without a final event are cancelled.
    """

    def __init__(self, flights: Flights, engine: Engine, requests: list[Request]) -> None:
        self.requests = requests
        self.mix = BASE  # the requests' effective mix, once the engine received them
        self._flights, self._engine = flights, engine
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._finished: set[int] = set()
        self._gone = False  # the client disconnected
        self._aborted: str | None = None  # set by `abort`: the unfinished requests' error
        self.endpoint = current_endpoint.get()  # for the log line of a client that left

    def wake_threadsafe(self) -> None:
        """Any thread: an event arrived on one of the requests' queues."""
        try:
            self._loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:  # the loop is closed: nobody reads any more
            pass

    async def events(self, http: HttpRequest | None = None) -> AsyncIterator[tuple[int, Event]]:
        """(index, event) pairs as the engine sends them, until every request is done.

        With `http`, a client that disconnects cancels the requests and ends the stream.
        """
        watcher = asyncio.create_task(self._watch(http)) if http is not None else None
        reqs, finished = self.requests, self._finished
        try:
            while len(finished) < len(reqs):
                got = False
                for i, r in enumerate(reqs):
                    while i not in finished:
                        try:
                            ev = r.events.get_nowait()
                        except queue.Empty:
                            break
                        got = True
                        if ev.done:
                            finished.add(i)
                        yield i, ev
                if got or len(finished) == len(reqs):
                    continue
                if self._gone:
                    return
                if self._aborted is not None:
                    end = Event(done=True, error=self._aborted, error_type="unavailable_error")
                    for i in sorted(set(range(len(reqs))) - finished):
                        finished.add(i)
                        yield i, end
                    return
                self._wake.clear()
                if any(not r.events.empty() for r in reqs):
                    continue
                await self._wake.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            self.close()

    async def _watch(self, http: HttpRequest) -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass
        self._gone = True
        self._log_left()
        self._cancel()
        self._wake.set()

    def abort(self, message: str) -> None:
        """End the flight: cancel its unfinished requests, which then fail with `message`."""
        self._aborted = message
        self._cancel()
        self._wake.set()

    def close(self) -> None:
        """Cancel what has not finished and stop following the requests (idempotent); the
        first close with requests unfinished (the client left, or stopped reading) logs one
        line naming them and the endpoint."""
        if self._aborted is None:
            self._log_left()
        self._cancel()
        self._flights._forget(self)

    def _log_left(self) -> None:
        """One line naming the requests about to be cancelled unfinished, if any."""
        reqs = self.requests
        left = [r.id for i, r in enumerate(reqs) if i not in self._finished and not r.cancelled]
        if left:
            ids = ",".join(map(str, left))
            log.info("client left %s: requests %s cancelled unfinished", self.endpoint, ids)

    def _cancel(self) -> None:
        for i, r in enumerate(self.requests):
            if i not in self._finished and not r.cancelled:
                self._engine.cancel(r)
