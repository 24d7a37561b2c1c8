"""The hostile-load storm (issue 31): well-behaved streaming clients and hostile ones at once
against a server, /health probed throughout (tests/hardening/test_hostile_load.py against a
server in a thread, bench/hostile_health.py against a server process)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import httpx

GOOD = [
    {"prompt": "the cat was on his way to", "n_predict": 16, "temperature": 0, "n_probs": 2},
    {"prompt": "a dog of the", "n_predict": 16, "temperature": 0.9, "seed": 11},
    {"prompt": "they are in the way", "n_predict": 16, "temperature": 0.7, "seed": 3},
    {"prompt": "it was the house of", "n_predict": 16, "temperature": 0, "top_k": 5},
]
ROUNDS = 3  # each good client streams its request this many times


async def stream_good(c: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int, Any]:
    """A streamed completion: its status and what it said (text, tokens, probabilities)."""
    async with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            return r.status_code, await r.aread()
        events = []
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                e = json.loads(line[6:])
                events.append((e["content"], e.get("tokens"), e.get("completion_probabilities")))
        return 200, events


def hostile_requests() -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, path, body) of every hostile request, three rounds of each kind."""
    bias_texts = {f"{i} the cat sat on {'x' * 200}"[:256]: -1.0 for i in range(1024)}
    bias_ids = [[i % 320, 0.5] for i in range(1024)]
    huge = "the cat sat " * 20_000
    docs = [f"document {i} about the cat" for i in range(64)]
    out: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(3):
        out += [
            ("bias", "/completion", {"prompt": "x", "n_predict": 2, "logit_bias": bias_texts}),
            ("bias", "/completion", {"prompt": "x", "n_predict": 2, "logit_bias": bias_ids}),
            ("mixed", "/completion", {"prompt": [huge, 5, huge], "n_predict": 1}),
            ("mixed", "/tokenize", {"content": [huge, 7], "with_pieces": True}),
            ("rerank", "/rerank", {"query": "which cat " * 50, "documents": docs}),
            ("rerank", "/v1/rerank", {"query": "cat", "documents": docs[:8]}),
            ("slot", "/slots/1?action=save", {"filename": f"s{i}.bin"}),
            ("slot", "/slots/2?action=erase", {}),
            ("adapter", "/lora-adapters/load", {"path": "a", "scale": 0.0}),
            ("adapter", "/lora-adapters/load", {"path": "../../etc", "scale": 0.0}),
        ]
    return out


async def hostile(c: httpx.AsyncClient, kind: str, path: str, body: dict[str, Any]) -> int:
    """One hostile request's status."""
    r = await c.post(path, json=body)
    return r.status_code


async def leave_early(c: httpx.AsyncClient) -> int:
    """A stream left after its first line."""
    body = {"prompt": "the of and to in", "n_predict": 200, "stream": True}
    async with c.stream("POST", "/completion", json=body) as r:
        async for _ in r.aiter_lines():
            break  # gone after the first line
        return r.status_code


async def health_probe(c: httpx.AsyncClient, stop: asyncio.Event, lat: list[float]) -> list[int]:
    """/health every 20 ms until ``stop``: its statuses; each latency appended to ``lat``."""
    codes = []
    while not stop.is_set():
        t = time.monotonic()
        r = await c.get("/health")
        lat.append(time.monotonic() - t)
        codes.append(r.status_code)
        await asyncio.sleep(0.02)
    return codes


async def storm(url: str) -> tuple[list[tuple[int, Any]], Counter[int], list[float]]:
    """The good clients (GOOD, ROUNDS times each) and the hostile ones at once against ``url``,
    /health probed throughout: (the good answers, every status counted, /health latencies)."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        stop = asyncio.Event()
        lat: list[float] = []
        probe = asyncio.create_task(health_probe(c, stop, lat))

        async def good_client(body: dict[str, Any]) -> list[tuple[int, Any]]:
            return [await stream_good(c, body) for _ in range(ROUNDS)]

        goods = [asyncio.create_task(good_client(b)) for b in GOOD]
        bad = [asyncio.create_task(hostile(c, *h)) for h in hostile_requests()]
        bad += [asyncio.create_task(leave_early(c)) for _ in range(8)]
        good_out = [x for g in await asyncio.gather(*goods) for x in g]
        codes = Counter(await asyncio.gather(*bad))
        stop.set()
        codes.update(await probe)
        codes.update(status for status, _ in good_out)
        return good_out, codes, lat
