"""Admission control over HTTP on the tiny model (issue 31 item 12): `--max-queue` refuses a
request past the bound at once with llama-server's 503 error shape and `Retry-After`, the
queued ones are served; slots go round-robin between clients (API keys), so one client's
many requests cannot keep another waiting behind all of them.

A waiting flight (the HTTP side of a request) is woken by the engine's events only, never
by a timer. The engine thread is held on a barrier (an engine call that waits) while requests queue,
so what is queued when is exact, not a matter of timing."""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loraserve.engine.request import Event, Request, Run
from loraserve.engine.sampling.params import SamplingParams
from loraserve.server.flight import Flights
from tests.server_util import Served, serve_in_thread, start_process

KEYS = ("key-a", "key-b")


@pytest.fixture(scope="module")
def srv() -> Iterator[Served]:
    args = ["-np", "1", "-c", "256", "--max-queue", "3", "--api-key", KEYS[0], "--api-key", KEYS[1]]
    with serve_in_thread(args) as s:
        yield s


def _engine(srv: Served):
    return srv.app.state.server.engine


class Held:
    """The engine thread waiting on an event (between steps) until `release`."""

    def __init__(self, srv: Served) -> None:
        self.gate = threading.Event()
        self.engine = _engine(srv)
        self.done = self.engine.call(self.gate.wait)

    def wait_queued(self, n: int) -> None:
        deadline = time.monotonic() + 30
        while self.engine.core.scheduler.queue.queued < n:
            assert time.monotonic() < deadline, "requests did not queue"
            time.sleep(0.005)

    def release(self) -> None:
        self.gate.set()
        self.done.result(10)


def _post(srv: Served, key: str, body: dict[str, Any], out: list, path: str = "/completion"):
    def run() -> None:
        out.append(
            httpx.post(
                f"{srv.url}{path}",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )
        )

    t = threading.Thread(target=run)
    t.start()
    return t


BODY = {"prompt": "the cat", "n_predict": 2, "temperature": 0}


def test_past_the_bound_a_503_with_retry_after(srv: Served) -> None:
    held = Held(srv)
    answers: list[httpx.Response] = []
    try:
        threads = [_post(srv, KEYS[0], BODY, answers) for _ in range(3)]
        held.wait_queued(3)
        auth = {"Authorization": f"Bearer {KEYS[1]}"}
        refused = [
            srv.client.post("/completion", json=BODY, headers=auth),
            srv.client.post("/v1/completions", json={**BODY, "stream": True}, headers=auth),
            srv.client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                headers=auth,
            ),
        ]
    finally:
        held.release()
    for t in threads:
        t.join(60)
    for r in refused:
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
        err = r.json()["error"]
        assert err["code"] == 503 and err["type"] == "unavailable_error"
        assert "--max-queue 3" in err["message"]
    assert [a.status_code for a in answers] == [200] * 3  # the queued ones are served
    assert _engine(srv).core.scheduler.queue.queued == 0
    assert srv.client.post("/completion", json=BODY, headers=auth).status_code == 200


def test_n_counts_every_choice_against_the_bound(srv: Served) -> None:
    held = Held(srv)
    answers: list[httpx.Response] = []
    try:
        t = _post(srv, KEYS[0], BODY, answers)
        held.wait_queued(1)
        auth = {"Authorization": f"Bearer {KEYS[0]}"}
        # 3 prompts: 1 + 3 > 3
        r = srv.client.post("/completion", json={**BODY, "prompt": ["a", "b", "c"]}, headers=auth)
    finally:
        held.release()
    t.join(60)
    assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
    assert answers[0].status_code == 200


def test_slots_go_round_robin_between_clients(srv: Served) -> None:
    """One slot; client A queues 3 requests, then client B 2: they alternate, A, B, A, B, A
    (or B first, if A was served more recently by the tests before); FIFO would run A, A,
    A, B, B."""
    order: list[str] = []
    engine = _engine(srv)

    def listen(run: Run, ev: Event) -> None:
        if run.req.id not in seen:
            seen.add(run.req.id)
            order.append(run.req.client)

    seen: set[int] = set()
    engine.listeners.append(listen)
    engine.core.scheduler.queue.limit = 0  # 5 queue here
    held = Held(srv)
    answers: list[httpx.Response] = []
    threads = []
    try:
        for i, key in enumerate([KEYS[0]] * 3 + [KEYS[1]] * 2):
            threads.append(_post(srv, key, BODY, answers))
            held.wait_queued(i + 1)  # arrival order is exact
    finally:
        held.release()
        for t in threads:
            t.join(60)
        engine.listeners.remove(listen)
        engine.core.scheduler.queue.limit = 3
    assert [a.status_code for a in answers] == [200] * 5
    # alternating while both wait (who starts depends on who was served last before)
    assert all(order[i] != order[i + 1] for i in range(3)), order
    assert order.count(order[4]) == 3  # then the one with requests left: A


def test_a_waiting_flight_is_woken_by_events_only() -> None:
    """A flight waiting for its request's events reads its queue only when woken (the engine
    listener), never on a timer: over an idle second it does not look at the queue at all."""

    class Counting(queue.Queue):
        reads = 0

        def get_nowait(self):  # type: ignore[no-untyped-def]
            Counting.reads += 1
            return super().get_nowait()

    class NoEngine:
        def cancel(self, req: Request) -> None:
            req.cancelled = True

    async def main() -> tuple[int, int, list[Event]]:
        req = Request(prompt=[1], sampling=SamplingParams(), max_tokens=1)
        req.events = Counting()
        flights = Flights()
        flight = flights.start(NoEngine(), [req])  # type: ignore[arg-type]
        got: list[Event] = []

        async def follow() -> None:
            async for _, ev in flight.events():
                got.append(ev)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.1)
        before = Counting.reads
        await asyncio.sleep(1.2)  # idle: a 0.5 s poll would have read the queue twice
        idle = Counting.reads - before
        ev = Event(done=True)
        req.events.put(ev)
        flights.listener(Run(req=req, slot=0, tokens=[1]), ev)
        await asyncio.wait_for(task, 10)
        return idle, Counting.reads - before, got

    idle, after, got = asyncio.run(main())
    assert idle == 0 and after >= 1 and len(got) == 1 and got[0].done


def test_open_connections_are_bounded() -> None:
    """`--max-connections 3`: with three connections held open (idle), a request on a fourth
    is answered 503 at once; once they close, requests are served again."""
    proc, url = start_process(["--max-connections", "3", "-np", "1", "-c", "256"])
    held: list[socket.socket] = []
    try:
        host, port = url.removeprefix("http://").split(":")
        for _ in range(3):
            held.append(socket.create_connection((host, int(port))))
        time.sleep(0.2)  # let the server accept them
        r = httpx.get(f"{url}/health", timeout=30)
        assert r.status_code == 503
        for s in held:
            s.close()
        held.clear()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "connections were not released"
            time.sleep(0.1)
    finally:
        for s in held:
            s.close()
        proc.terminate()
        proc.wait(30)
