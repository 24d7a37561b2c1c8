"""Preemption over HTTP (`--preempt-after`, `engine/preemption.py`): with one slot and a
bound so small that the streams take turns at nearly every token, each streamed answer is
event for event what the same request streams on an idle server: no token twice, none lost,
the same probabilities."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server_util import Served, serve_in_thread

BODIES = [
    {"prompt": "the cat was on his way to", "n_predict": 40, "temperature": 0.9, "seed": 4},
    {"prompt": "a dog of the", "n_predict": 30, "temperature": 0, "n_probs": 2},
    {"prompt": "it was the house", "n_predict": 36, "temperature": 0.7, "seed": 9, "n_probs": 1},
]


@pytest.fixture(scope="module")
def srv() -> Iterator[Served]:
    with serve_in_thread(["-np", "1", "-c", "512", "--preempt-after", "0.000001"]) as s:
        yield s


def streamed(srv: Served, body: dict[str, Any]) -> list[tuple]:
    events = [json.loads(e) for e in srv.sse("/completion", {**body, "stream": True})]
    return [
        (e["content"], e.get("tokens"), e.get("completion_probabilities"), e["stop"])
        for e in events
    ]


def test_streams_that_take_turns_in_one_slot_answer_as_alone(srv: Served) -> None:
    alone = [streamed(srv, b) for b in BODIES]
    got: list[list[tuple] | None] = [None] * len(BODIES)

    def client(i: int) -> None:
        got[i] = streamed(srv, BODIES[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(BODIES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == alone
    assert srv.app.state.server.engine.core.scheduler.preemption.n_preempted > 0
