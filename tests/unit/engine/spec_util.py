"""The speculation tests' toolkit: n-gram spec configs, prompts that repeat themselves, two
adapters on the tiny model, and the answers with their draft counts."""

from __future__ import annotations

import dataclasses
import functools
import random
import tempfile
from pathlib import Path

from loraserve.engine.engine import Engine
from loraserve.engine.request import Event
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecConfig
from tests.engine_util import run_and_drain as _run_and_drain
from tests.server_util import peft_folder

SIMPLE = SpecConfig(types=("ngram-simple",), ngram_simple_size_n=2, ngram_simple_size_m=6)
MOD = SpecConfig(types=("ngram-mod",), ngram_mod_n_match=2, ngram_mod_n_min=1, ngram_mod_n_max=6)
BOTH = SpecConfig(
    types=("ngram-simple", "ngram-mod"),
    ngram_simple_size_n=3,
    ngram_simple_size_m=8,
    ngram_mod_n_match=1,
    ngram_mod_n_min=2,
    ngram_mod_n_max=4,
)
SEEDED = SamplingParams(temperature=0.3, top_k=20, top_p=0.9, min_p=0.02)


def run_and_drain(eng: Engine, todo: list[dict]) -> list[list[Event]]:
    """`engine_util.run_and_drain`, every request finished without an error."""
    out = _run_and_drain(eng, todo)
    assert all(evs[-1].error is None for evs in out)
    return out


@functools.cache
def adapter_dir() -> Path:
    """A temporary folder of two PEFT adapters on the tiny model, a and b (made once)."""
    d = Path(tempfile.mkdtemp(prefix="loraserve-spec-"))
    for name, seed in (("a", 31), ("b", 32)):
        peft_folder(d / name, seed)
    return d


def copy_prompts(seed: int, k: int) -> list[list[int]]:
    """Prompts that repeat themselves (what an n-gram draft copies from)."""
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        body = [rng.randrange(3, 300) for _ in range(rng.randrange(4, 20))]
        out.append([1, *body, *body, *body[: rng.randrange(1, len(body))]])
    return out


MIXES = [None, {0: 1.0}, {1: 0.5}, {0: 1.0, 1: -1.0}]

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


def seeded(base: SamplingParams, seed: int) -> SamplingParams:
    """``base`` with its seed set."""
    return dataclasses.replace(base, seed=seed)


def answers(eng: Engine, todo: list[dict], concurrent: bool) -> list[list[Event]]:
    """Each request's events, submitted together (``concurrent``) or one at a time; then the
    prefix cache's own invariants hold."""
    if concurrent:
        out = run_and_drain(eng, todo)
    else:
        out = [run_and_drain(eng, [a])[0] for a in todo]
    eng.core.cache.check()
    return out


def drafted(evs: list[list[Event]]) -> tuple[int, int]:
    """(draft tokens proposed, draft tokens accepted) over the requests."""
    t = [e[-1].timings for e in evs]
    return sum(x.draft_n for x in t if x), sum(x.draft_n_accepted for x in t if x)
