"""What a flight's engine requests produce, the same way for every API: each request's
`Output` gathered from its events, then either collected for one JSON answer (`collect`)
or streamed as server-sent events, one body per event (`stream`)."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import StreamingResponse

from loraserve.engine.request import Event, Progress, Timings
from loraserve.server.errors import STATUS_OF_TYPE, ApiError, server_error
from loraserve.server.flight import Flight
from loraserve.server.sse import SSE_DONE, sse_event, sse_response

Body = dict[str, Any]


@dataclass
class Output:
    """What one engine request produced, gathered from its events."""

    prompt: list[int]
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    probs: list[tuple[int, float | None, list[tuple[int, float]]]] = field(default_factory=list)
    final: Event | None = None
    progress: Progress | None = None  # the last prompt-progress event (`return_progress`)
    t_first: float = 0.0  # when the first token came (`partial_timings`)

    def add(self, ev: Event) -> None:
        self.text += ev.text
        if ev.progress is not None:
            self.progress = ev.progress
        if ev.token is not None:
            if not self.tokens:
                self.t_first = time.perf_counter()
            self.tokens.append(ev.token)
            if ev.probs is not None:
                self.probs.append((ev.token, token_prob(ev), ev.probs))
        if ev.done:
            self.final = ev

    @property
    def n_prompt(self) -> int:
        return (self.final.n_prompt if self.final else 0) or len(self.prompt)

    @property
    def n_generated(self) -> int:
        return (self.final.n_generated if self.final else 0) or len(self.tokens)

    def timings(self) -> dict[str, float | int]:
        """llama-server's `timings` object of the finished request."""
        if self.final is not None and self.final.timings is not None:
            return self.final.timings.as_dict()
        return Timings(prompt_n=len(self.prompt), predicted_n=len(self.tokens)).as_dict()

    def partial_timings(self) -> dict[str, float | int]:
        """`timings` while streaming (`timings_per_token`): the prompt's from the last
        progress event, generation timed here since the first token."""
        p = self.progress
        t = Timings(prompt_n=len(self.prompt), predicted_n=len(self.tokens))
        if p is not None:
            t.cache_n, t.prompt_n, t.prompt_ms = p.cache, p.total - p.cache, p.time_ms
        if self.t_first:
            t.predicted_ms = (time.perf_counter() - self.t_first) * 1000
        return t.as_dict()


def progress_timings(p: Progress) -> dict[str, float | int]:
    """`timings` of a prompt-progress chunk (`timings_per_token`): the prompt tokens computed
    so far and their milliseconds (0 and 0.0 before the first batch), nothing generated."""
    n = p.processed - p.cache
    return Timings(cache_n=p.cache, prompt_n=n, prompt_ms=p.time_ms if n else 0.0).as_dict()


def token_prob(ev: Event) -> float | None:
    """Probability of the sampled token in the distribution `ev.probs` was taken from."""
    prob = ev.prob
    if prob is None and ev.probs:
        prob = next((p for t, p in ev.probs if t == ev.token), None)
    return prob


def logprob(p: float | None) -> float:
    """log(p); -inf for 0 or unknown (serialized as null)."""
    return math.log(p) if p else -math.inf


def error_of(ev: Event) -> ApiError:
    """The error answer for a request that failed inside the engine."""
    status = STATUS_OF_TYPE.get(ev.error_type, 500)
    return ApiError(status, ev.error_type, ev.error or "request failed")


async def collect(flight: Flight, http: HttpRequest | None = None) -> list[Output]:
    """Every request's output once all are done; with `http`, a disconnect cancels them.
    Raises the error answer of a request that failed."""
    outs = [Output(prompt=r.prompt) for r in flight.requests]
    async for i, ev in flight.events(http):
        outs[i].add(ev)
    for out in outs:
        if out.final is None:
            raise server_error("request cancelled")
        if out.final.error:
            raise error_of(out.final)
    return outs


def stream(
    flight: Flight,
    chunk: Callable[[int, Output, Event], Body | list[Body] | None],
    tail: Callable[[list[Output]], list[Body]] | None = None,
    done_marker: bool = False,
    frame: Callable[[Body], bytes] = sse_event,
) -> StreamingResponse:
    """Server-sent events of `flight`: `chunk(index, output so far, event)` for each event
    (None: nothing to send; a list: several bodies), the error answer's body for a failed
    request; then, if every request succeeded, the bodies of `tail(outputs)`; then `[DONE]`
    with `done_marker`. `frame` writes one body as an event (default `data: {json}`)."""

    async def events() -> AsyncIterator[bytes]:
        outs = [Output(prompt=r.prompt) for r in flight.requests]
        try:
            async for i, ev in flight.events():
                outs[i].add(ev)
                if ev.error:
                    yield frame(error_of(ev).body())
                    continue
                body = chunk(i, outs[i], ev)
                for one in body if isinstance(body, list) else [] if body is None else [body]:
                    yield frame(one)
            if tail is not None and all(o.final is not None and not o.final.error for o in outs):
                for body in tail(outs):
                    yield frame(body)
            if done_marker:
                yield SSE_DONE
        finally:
            flight.close()

    return sse_response(events())
