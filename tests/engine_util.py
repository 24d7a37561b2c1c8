"""Driving an `Engine` from the test thread: random prompts (`random_prompts`), one request's
`Engine.submit` arguments (`ask`), the one run-and-drain (`run_and_drain`: submit, step until
idle, collect every request's events; `run_one` for a single request) and what tests read from
the events; `follow` reads a request on a started engine. The engine thread is not started
here; `Engine.run_until_idle` steps the engine in the caller's thread."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from loraserve.engine.engine import Engine
from loraserve.engine.request import Event, Request
from loraserve.engine.sampling.params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
MixArg = Mapping[int, float] | Sequence[tuple[int, float]]
_STEPPING = threading.Lock()  # one caller at a time steps an engine from outside it


def random_prompts(seed: int, k: int) -> list[list[int]]:
    """``k`` random prompts: token 1, then 2 to 39 ids in [3, 320)."""
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 320) for _ in range(rng.randrange(2, 40))] for _ in range(k)]


def ask(prompt: list[int], n: int = 8, mix: MixArg | None = None, **kw: Any) -> dict[str, Any]:
    """`Engine.submit`'s keyword arguments for one prompt and ``n`` tokens (greedy unless
    ``sampling`` is given). ``mix``: {adapter id: scale} or (id, scale) pairs; empty or
    absent means no ``lora`` (the global scales), unless ``lora`` is given itself."""
    if mix is not None:
        pairs = list(mix.items()) if isinstance(mix, Mapping) else list(mix)
        kw["lora"] = pairs or None
    return dict(prompts=[prompt], sampling=kw.pop("sampling", GREEDY), max_tokens=n, **kw)


def drain(req: Request) -> list[Event]:
    """The events a finished request posted, in order; the last one is its final event."""
    evs = []
    while not req.events.empty():
        evs.append(req.events.get())
    assert evs and evs[-1].done, "no final event"
    return evs


def run_and_drain(eng: Engine, asks: Iterable[dict[str, Any]]) -> list[list[Event]]:
    """Submit every ask at once, step the engine until nothing is left, and return each
    request's events, in submission order (a prompt's ``n`` choices next to each other).
    Callers in several threads (a test's client threads checking a shared reference
    engine) take turns; the engine must not be started."""
    with _STEPPING:
        reqs = [r for a in asks for r in eng.submit(**a).requests]
        eng.run_until_idle()
        return [drain(r) for r in reqs]


def tokens(evs: list[Event]) -> list[int]:
    return [e.token for e in evs if e.token is not None]


def text_of(evs: list[Event]) -> str:
    return "".join(e.text for e in evs)


def run_one(
    eng: Engine, prompt: list[int], n: int = 8, mix: MixArg | None = None, **kw: Any
) -> list[int]:
    """The tokens of one request run by itself on ``eng`` (which must be idle); it must
    finish without an error."""
    (evs,) = run_and_drain(eng, [ask(prompt, n, mix, **kw)])
    assert evs[-1].error is None, evs[-1].error
    return tokens(evs)


def follow(req: Request, timeout: float = 30) -> list[Event]:
    """The events of a request on a started engine (`Engine.start`), up to its final one."""
    evs = [req.events.get(timeout=timeout)]
    while not evs[-1].done:
        evs.append(req.events.get(timeout=timeout))
    return evs
