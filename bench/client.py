"""HTTP client side of the benchmark: streamed `/completion` calls timed from the client.

Both servers speak llama-server's `/completion` SSE stream (`data: {json}` events, the last
one with `"stop": true` and `timings`), so one client measures both the same way.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx


class BenchError(RuntimeError):
    """A server answered with an error or broke the protocol."""


@dataclass
class Completion:
    """One streamed completion as the client saw it (times from `perf_counter`)."""

    sent: float
    first: float | None = None
    last: float | None = None
    done: float | None = None
    n_tokens: int = 0
    content: str = ""
    tokens: list[int] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def latency(self) -> float | None:
        return None if self.done is None else self.done - self.sent

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second after the first one, as the client received them."""
        if self.first is None or self.last is None or self.n_tokens < 2 or self.last <= self.first:
            return None
        return (self.n_tokens - 1) / (self.last - self.first)

    @property
    def timings(self) -> dict[str, Any]:
        return self.final.get("timings") or {}


def body(
    prompt: Sequence[int],
    n_predict: int,
    lora: list[dict[str, float]] | None,
    *,
    ignore_eos: bool = True,
    cache_prompt: bool = True,
) -> dict[str, Any]:
    """A greedy `/completion` body; `lora` None leaves the field out (global mix applies)."""
    out: dict[str, Any] = {
        "prompt": list(prompt),
        "n_predict": n_predict,
        "temperature": 0.0,
        "ignore_eos": ignore_eos,
        "cache_prompt": cache_prompt,
        "return_tokens": True,
    }
    if lora is not None:
        out["lora"] = lora
    return out


async def stream_completion(
    client: httpx.AsyncClient, base_url: str, payload: dict[str, Any], result: Completion
) -> Completion:
    """POST `payload` with `stream` on, filling `result` as events arrive (so a caller that
    cancels at a deadline still sees the tokens received until then)."""
    async with client.stream(
        "POST", f"{base_url}/completion", json={**payload, "stream": True}
    ) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")[:300]
            raise BenchError(f"/completion answered {r.status_code}: {text}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise BenchError(f"/completion stream error: {event['error']}")
            now = time.perf_counter()
            if event.get("stop"):
                result.final = event
                result.done = now
                break
            toks = event.get("tokens") or []
            n = len(toks) if toks else int(bool(event.get("content")))
            if n:
                result.first = result.first or now
                result.last = now
                result.n_tokens += n
                result.tokens += toks
                result.content += event.get("content", "")
    if result.done is None:
        raise BenchError("/completion stream ended without a final event")
    result.content += result.final.get("content", "") if not result.content else ""
    return result


async def run_concurrent(
    base_url: str,
    payloads: Sequence[dict[str, Any]],
    *,
    time_cap: float,
    starts: Sequence[float] | None = None,
) -> tuple[list[Completion], float]:
    """Send `payloads` (all at once, or each at its `starts` offset in seconds) and wait for
    all of them, at most `time_cap` seconds; unfinished ones are cancelled (the client
    disconnects) and keep what they had received. Returns the completions and the wall time
    from the first send to the last token received."""
    limits = httpx.Limits(max_connections=len(payloads) + 4)
    timeout = httpx.Timeout(time_cap + 30)
    results = [Completion(sent=0.0) for _ in payloads]
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            if starts is not None:
                await asyncio.sleep(max(0.0, t0 + starts[i] - time.perf_counter()))
            results[i].sent = time.perf_counter()
            await stream_completion(client, base_url, payloads[i], results[i])

        tasks = [asyncio.create_task(one(i)) for i in range(len(payloads))]
        done, pending = await asyncio.wait(tasks, timeout=time_cap)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    ends = [r.last or r.sent for r in results if r.sent]
    return results, (max(ends) - t0) if ends else 0.0


def complete_sync(client: httpx.Client, base_url: str, payload: dict[str, Any]) -> Completion:
    """One streamed completion from synchronous code."""

    async def go() -> Completion:
        async with httpx.AsyncClient(timeout=client.timeout) as ac:
            return await stream_completion(ac, base_url, payload, Completion(time.perf_counter()))

    return asyncio.run(go())
