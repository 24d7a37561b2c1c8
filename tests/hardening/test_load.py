"""Bounded load on a tiny model: 64 concurrent clients x 10 requests.

Random adapter mixes (adapters loaded at start), prompts sharing prefixes, streaming and
plain requests mixed, some clients leaving early, and global scale switches meanwhile.
Zero unexpected errors; every finished answer equals its cache-off reference computed by a
separate engine on the same model and adapter files, under the mix the server reports it
ran with; afterwards nothing is processing or deferred, no request holds a KV block (every
used block is held by an idle slot or cached, on the engine's own count and on what /slots
and /metrics report), the index is consistent, and /health answers.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from loraserve.server.generation import tokenize_prompt
from tests.engine_util import ask, run_and_drain, text_of
from tests.server_util import Served, peft_folder, scrape_metrics, serve_in_thread, tiny_model

CLIENTS, PER_CLIENT, SLOTS = 64, 10, 8
PREFIXES = [
    "the of and to in is it that was for on are as with his they",
    "a cat was on his way to the house of the dog and it is",
    "they are in the way of a cat that was with his dog on the",
]
TAILS = ["with his", "they are", "in the", "it was the of"]
MIXES: list[list[dict[str, float]] | None] = [
    None,  # the global scales at receipt
    [],  # the same
    [{"id": 0, "scale": 1.0}],
    [{"id": 1, "scale": 0.5}],
    [{"id": 0, "scale": 0.5}, {"id": 2, "scale": 1.0}],
    [{"id": 0, "scale": 0.0}],  # the base model
]
GLOBALS = [[], [{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 1.0}, {"id": 2, "scale": 0.5}]]


@dataclass
class Answer:
    """One finished request: what was asked, the effective mix, and the text."""

    prompt: str
    mix: tuple[tuple[int, float], ...]
    n_predict: int
    text: str


@pytest.fixture(scope="module")
def lora_paths(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("load-loras")
    return [peft_folder(d / f"a{i}", 20 + i) for i in range(3)]


@pytest.fixture(scope="module")
def srv(lora_paths):
    lora = [x for p in lora_paths for x in ("--lora", str(p))]
    args = ["-np", str(SLOTS), "-c", str(256 * SLOTS), "--temp", "0", "--metrics", *lora]
    with serve_in_thread([*args, "--lora-init-without-apply"]) as s:
        yield s


def _mix(settings: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    return tuple(sorted((x["id"], float(x["scale"])) for x in settings["lora"]))


async def _client(
    c: httpx.AsyncClient, seed: int, answers: list[Answer], errors: list[str], stats: dict
) -> None:
    rng = random.Random(seed)
    for _ in range(PER_CLIENT):
        prompt = f"{rng.choice(PREFIXES)} {rng.choice(TAILS)}"
        body: dict[str, Any] = {"prompt": prompt, "n_predict": rng.choice([4, 8, 12])}
        body["ignore_eos"] = True
        if (lora := rng.choice(MIXES)) is not None:
            body["lora"] = lora
        mode = rng.choices(["plain", "stream", "leave-stream", "leave-plain"], [4, 4, 1, 1])[0]
        stats[mode] = stats.get(mode, 0) + 1
        try:
            if mode == "plain":
                r = await c.post("/completion", json=body)
                if r.status_code != 200:
                    errors.append(f"plain {r.status_code}: {r.text[:200]}")
                    continue
                res = r.json()
                answers.append(
                    Answer(
                        prompt, _mix(res["generation_settings"]), body["n_predict"], res["content"]
                    )
                )
            elif mode == "stream":
                async with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
                    if r.status_code != 200:
                        errors.append(f"stream {r.status_code}: {(await r.aread())[:200]!r}")
                        continue
                    evs = [json.loads(x[6:]) async for x in r.aiter_lines() if x.startswith("data")]
                if "error" in evs[-1] or not evs[-1]["stop"]:
                    errors.append(f"stream ended with {evs[-1]}")
                    continue
                text = "".join(e["content"] for e in evs)
                mix = _mix(evs[-1]["generation_settings"])
                answers.append(Answer(prompt, mix, body["n_predict"], text))
            elif mode == "leave-stream":
                async with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
                    async for _ in r.aiter_lines():
                        break
            else:
                try:
                    await asyncio.wait_for(c.post("/completion", json=body), rng.uniform(0, 0.05))
                except TimeoutError:
                    pass
        except httpx.HTTPError as e:
            errors.append(f"{mode}: {type(e).__name__}: {e}")


async def _switcher(c: httpx.AsyncClient, done: asyncio.Event, errors: list[str]) -> int:
    rng, n = random.Random(99), 0
    while not done.is_set():
        r = await c.post("/lora-adapters", json=rng.choice(GLOBALS))
        n += 1
        if r.status_code != 200:
            errors.append(f"switch {r.status_code}: {r.text[:200]}")
        await asyncio.sleep(0.02)
    return n


async def _run(url: str) -> tuple[list[Answer], list[str], dict]:
    answers: list[Answer] = []
    errors: list[str] = []
    stats: dict = {}
    limits = httpx.Limits(max_connections=CLIENTS + 8, max_keepalive_connections=CLIENTS + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        done = asyncio.Event()
        switcher = asyncio.create_task(_switcher(c, done, errors))
        await asyncio.gather(*(_client(c, i, answers, errors, stats) for i in range(CLIENTS)))
        done.set()
        stats["switches"] = await switcher
    return answers, errors, stats


def references(answers: list[Answer], paths: list[Path]) -> dict[tuple, str]:
    """Cache-off greedy texts of every distinct (prompt, mix, n_predict), on a separate engine
    (the step context is thread-local: this one runs in the test thread)."""
    model = tiny_model()
    eng = Engine(model, EngineConfig(n_slots=SLOTS, n_ctx=256 * SLOTS, cache_ram_mib=0))
    for p in paths:
        eng.load_adapter(p, 0.0).result()  # same order, same ids as the server's --lora flags
    greedy = SamplingParams(temperature=0.0, ignore_eos=True)
    keys = sorted({(a.prompt, a.mix, a.n_predict) for a in answers})
    asks = [
        ask(tokenize_prompt(model.tokenizer, p), n, mix, sampling=greedy, cache_prompt=False)
        for p, mix, n in keys
    ]
    out = {}
    for key, evs in zip(keys, run_and_drain(eng, asks), strict=True):
        assert evs[-1].error is None
        out[key] = text_of(evs)
    return out


def settle(srv: Served) -> list[dict]:
    """/slots once every cancelled request has left its slot."""
    deadline = time.monotonic() + 20
    while any((slots := srv.client.get("/slots").json())[i]["is_processing"] for i in range(SLOTS)):
        assert time.monotonic() < deadline, "a slot is still processing"
        time.sleep(0.05)
    return slots


def kv_accounting(srv: Served) -> dict[str, int]:
    """On the engine thread: used blocks = blocks idle slots hold + blocks only cached."""
    eng = srv.app.state.server.engine

    def check() -> dict[str, int]:
        core = eng.core
        core.cache.check()
        held = {b for s in core.scheduler.slots for b in s.blocks}
        for b in held:
            assert core.pool.refcount[b] == sum(b in s.blocks for s in core.scheduler.slots)
        return {
            "used": core.pool.num_used,
            "held": len(held),
            "cached": core.cache.num_cached(),
            "running": len(core.scheduler.running),
            "waiting": len(core.scheduler.waiting),
        }

    return eng.call(check).result(30)


def test_64_clients_x_10_requests(srv, lora_paths) -> None:
    t0 = time.monotonic()
    answers, errors, stats = asyncio.run(_run(srv.url))
    elapsed = time.monotonic() - t0
    assert not errors, errors[:10]
    slots = settle(srv)
    assert srv.client.get("/health").json() == {"status": "ok"}
    kv = kv_accounting(srv)
    assert kv["running"] == kv["waiting"] == 0
    assert kv["used"] == kv["held"] + kv["cached"], kv
    metrics = scrape_metrics(srv)
    assert metrics["llamacpp:requests_processing"] == 0
    assert metrics["llamacpp:requests_deferred"] == 0
    assert metrics["loraserve:kv_blocks_used"] == kv["used"]
    assert not any(s["is_processing"] for s in slots)
    held = sum(-(-s["n_tokens"] // 16) for s in slots)  # blocks the idle slots retain
    assert metrics["loraserve:kv_blocks_used"] <= held + metrics["loraserve:kv_blocks_cached"]
    refs = references(answers, lora_paths)
    wrong = [a for a in answers if a.text != refs[(a.prompt, a.mix, a.n_predict)]]
    assert not wrong, wrong[:5]
    n = sum(v for k, v in stats.items() if k != "switches")
    assert n == CLIENTS * PER_CLIENT and len(answers) == stats["plain"] + stats["stream"]
    print(
        f"\nload: {n} requests ({stats}), {len(answers)} answers checked against "
        f"{len(refs)} references, {len(errors)} errors, {elapsed:.1f} s; KV {kv}"
    )
