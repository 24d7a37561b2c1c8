"""A small concurrent load: clients mixing streaming, plain and abandoned requests over
shared prefixes. Every finished greedy answer equals its cache-off reference, and after
the run nothing is processing, no KV block is held by a request, and /health answers."""

from __future__ import annotations

import json
import random
import threading

import httpx
import pytest

from tests.server_util import scrape_metrics, serve_in_thread

PREFIXES = ["the of and to in is it", "a cat was on his way", "that was for on are"]


@pytest.fixture(scope="module")
def srv():
    with serve_in_thread(["-np", "4", "-c", "1024", "--temp", "0", "--metrics"]) as s:
        yield s


def prompts() -> list[str]:
    return [f"{p} {tail}" for p in PREFIXES for tail in ("with his", "they are", "in the")]


def test_concurrent_clients(srv) -> None:
    refs = {}
    for p in prompts():
        body = {"prompt": p, "n_predict": 12, "ignore_eos": True, "cache_prompt": False}
        refs[p] = srv.client.post("/completion", json=body).json()["content"]
    failures: list[str] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            for _ in range(3):
                p = rng.choice(prompts())
                body = {"prompt": p, "n_predict": 12, "ignore_eos": True}
                mode = rng.choice(["plain", "stream", "abandon"])
                if mode == "plain":
                    got = c.post("/completion", json=body).json()["content"]
                elif mode == "stream":
                    with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
                        lines = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data")]
                    got = "".join(e["content"] for e in lines)
                else:
                    with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
                        next(r.iter_lines())
                    continue
                if got != refs[p]:
                    failures.append(f"{mode} {p!r}: {got!r} != {refs[p]!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert srv.client.get("/health").json() == {"status": "ok"}
    slots = srv.client.get("/slots").json()
    assert not any(s["is_processing"] for s in slots)
    metrics = scrape_metrics(srv)
    assert metrics["llamacpp:requests_processing"] == 0
    assert metrics["llamacpp:requests_deferred"] == 0
    held = sum(-(-s["n_tokens"] // 16) for s in slots)  # blocks the idle slots retain
    assert metrics["loraserve:kv_blocks_used"] <= held + metrics["loraserve:kv_blocks_cached"]
