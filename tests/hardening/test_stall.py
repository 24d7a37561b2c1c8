"""No request stalls the server: the work whose cost grows with the body (parsing a large body,
tokenizing, detokenizing, rendering a template) runs off the event loop, so other clients
(here /health) are answered meanwhile. Checked structurally (where the work ran), and the
/health latency during each large request is printed, never asserted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import loraserve.server.body as body_mod
import loraserve.server.chat_prompt as chat_prompt
from tests.server_util import Served, on_loop, serve_in_thread

TEXT = "the cat sat " * (2**20 // 12)  # 1 MiB
BIG = [
    ("/tokenize", {"content": TEXT}, 200),
    ("/tokenize", {"content": ["the", *[5] * 200_000], "with_pieces": True}, 200),
    ("/completion", {"prompt": TEXT}, 400),  # too long for the context, found off the loop
    ("/completion", {"prompt": [5] * 300_000}, 400),
    ("/detokenize", {"tokens": [300] * 300_000}, 200),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT}]}, 400),
    ("/apply-template", {"messages": [{"role": "user", "content": "x"}] * 50_000}, 200),
]


@pytest.fixture(scope="module")
def srv():
    with serve_in_thread(["-np", "2", "-c", "256"]) as s:
        yield s


@pytest.fixture()
def spied(srv, monkeypatch) -> list[tuple[str, bool]]:
    """(what, ran on the event loop) for every costly call the server makes."""
    calls: list[tuple[str, bool]] = []

    def spy(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **kw: Any) -> Any:
            calls.append((name, on_loop()))
            return fn(*a, **kw)

        return wrapped

    tok = srv.app.state.server.engine.tokenizer
    for name in ("encode", "decode"):
        monkeypatch.setattr(tok, name, spy(name, getattr(tok, name)))
    monkeypatch.setattr(body_mod, "parse_body", spy("parse", body_mod.parse_body))
    monkeypatch.setattr(chat_prompt, "render_prompt", spy("render", chat_prompt.render_prompt))
    return calls


def health_latency_during(srv: Served, path: str, body: Any) -> tuple[int, float]:
    lat: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            while not stop.is_set():
                t = time.monotonic()
                c.get("/health")
                lat.append(time.monotonic() - t)
                time.sleep(0.01)

    th = threading.Thread(target=probe)
    th.start()
    try:
        status = srv.client.post(path, json=body).status_code
    finally:
        stop.set()
        th.join()
    return status, max(lat, default=0.0)


@pytest.mark.parametrize(
    "path,body,status", BIG, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(BIG)]
)
def test_large_requests_work_off_the_event_loop(srv, spied, path, body, status) -> None:
    got, worst = health_latency_during(srv, path, body)
    assert got == status
    assert spied, "nothing costly was seen"
    assert not [name for name, looped in spied if looped], spied
    print(f"\n{path}: /health answered within {worst:.2f} s meanwhile")
    assert srv.client.get("/health").json() == {"status": "ok"}
