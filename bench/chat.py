"""S5: adapter-switching multi-turn chat, with every answer checked for staleness.

Several users, each pinned to an adapter mix, share a long system prompt; their turns are
interleaved, one request at a time, so each turn's answer is deterministic, and each turn is
also regenerated once under another mix (the same prompt, a different adapter). Two ways to
pick the mix:

- `explicit`: every request carries its full `lora` list;
- `global`: before each turn the client sets the global mix (`POST /lora-adapters`) and the
  request carries no `lora` (the path of llama.cpp #30366).

Afterwards every answer is replayed with the cache off (`stale.py`), those that reused KV
first, so a time cap cuts the least informative checks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

import httpx

from bench.client import Completion, body, stream_completion
from bench.scenarios import Target
from bench.stale import Answer, check_answers, http_reference
from bench.workloads import GEMMA_NEXT, chat_workload, mix_lora, percentile

MODES = ("explicit", "global")


def s5_mixes(n_adapters: int, n_users: int) -> list[tuple[tuple[int, float], ...]]:
    """Per-user weighted two-adapter mixes: user u gets adapter u at 0.8 and u+1 at 0.4."""
    return [((u % n_adapters, 0.8), ((u + 1) % n_adapters, 0.4)) for u in range(n_users)]


async def _ask(
    client: httpx.AsyncClient, target: Target, mode: str, prompt: list[int], mix: Any, cfg: dict
) -> tuple[Completion, list[dict[str, float]]]:
    lora = mix_lora(mix, target.n_adapters)
    if mode == "global":
        r = await client.post(f"{target.url}/lora-adapters", json=lora)
        r.raise_for_status()
    payload = body(prompt, cfg["n_predict"], lora if mode == "explicit" else None, ignore_eos=False)
    c = Completion(time.perf_counter())
    await stream_completion(client, target.url, payload, c)
    return c, lora


async def _turns(
    target: Target, mode: str, eog: Collection[int], cfg: dict[str, Any], t_end: float
) -> tuple[list[Answer], list[Completion]]:
    sessions, turns = chat_workload(
        target.encode,
        n_users=cfg["users"],
        n_turns=cfg["turns"],
        system_tokens=cfg["system_tokens"],
        mixes=s5_mixes(target.n_adapters, cfg["users"]),
        seed=cfg["seed"] + MODES.index(mode),
        bos=target.bos,
        regenerate=cfg["regenerate"],
    )
    answers: list[Answer] = []
    done: list[Completion] = []
    next_ids = target.encode(GEMMA_NEXT)
    async with httpx.AsyncClient(timeout=httpx.Timeout(cfg["cap"] + 30)) as client:
        for turn in turns:
            session = sessions[turn.user]
            prompt = session.history + turn.suffix
            asks = [("", turn.mix)] + ([(" regenerated", turn.alt_mix)] if turn.alt_mix else [])
            for what, mix in asks:
                if time.monotonic() > t_end or len(answers) >= cfg["max_requests"]:
                    return answers, done
                c, lora = await _ask(client, target, mode, prompt, mix, cfg)
                done.append(c)
                answers.append(
                    Answer(
                        label=f"{mode}: user {turn.user} turn {turn.turn}{what}",
                        prompt=prompt,
                        lora=lora,
                        n_predict=cfg["n_predict"],
                        content=c.content,
                        cache_n=int(c.timings.get("cache_n", 0)),
                        prompt_n=int(c.timings.get("prompt_n", 0)),
                    )
                )
                if not what:
                    reply = [t for t in (c.tokens or target.encode(c.content)) if t not in eog]
            session.history = prompt + reply + next_ids
    return answers, done


def s5_chat(target: Target, mode: str, eog: Collection[int], **overrides: Any) -> dict:
    """Run the chat workload one way (`explicit` or `global`) and check every answer.

    Reports prompt tokens evaluated and reused, time to first token p50/p95, and how many
    answers differ from their cache-off reference (`stale`: with reused KV).
    """
    cfg = {
        "users": 4,
        "turns": 2,
        "system_tokens": 200,
        "n_predict": 16,
        "regenerate": True,
        "max_requests": 16,
        "cap": 150.0,
        "seed": 50,
    }
    cfg.update(overrides)
    cap = target.cap(cfg["cap"])
    t0 = time.monotonic()
    t_end = t0 + cap
    answers, done = asyncio.run(_turns(target, mode, eog, cfg, t0 + cap / 2))
    with httpx.Client(timeout=httpx.Timeout(cfg["cap"])) as client:
        report = check_answers(
            sorted(answers, key=lambda a: -a.cache_n),
            http_reference(client, target.url),
            lambda: time.monotonic() < t_end,
        )
    ttft = [c.ttft for c in done if c.ttft is not None]
    return {
        "mode": mode,
        "requests": len(answers),
        "prompt_tokens": sum(len(a.prompt) for a in answers),
        "prompt_tokens_evaluated": sum(a.prompt_n for a in answers),
        "prompt_tokens_reused": sum(a.cache_n for a in answers),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "stale_check": report.summary(),
        "config": {k: v for k, v in cfg.items() if k != "seed"},
    }
