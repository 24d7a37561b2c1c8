"""The speculator's decisions without a model: n-gram drafts as llama.cpp finds them (the
packed search equals its loop), the back-off after rejections (skips, the cap and its n_min
floor), draft limits rounded to whole 4-row tiles, no drafts in a large batch, and drafts
that fit the step's token budget."""

from __future__ import annotations

import dataclasses
import random

from loraserve.engine.request import Request, Run
from loraserve.engine.sampling.state import SamplerState
from loraserve.engine.spec.config import SpecConfig
from loraserve.engine.spec.drafter import (
    FIRST_CAP,
    MAX_BACKOFF,
    MAX_BATCH,
    SpecRun,
    Speculator,
)
from loraserve.engine.spec.ngram import TokenBytes, ngram_simple_draft
from tests.unit.engine.spec_util import BOTH, GREEDY, MOD


def _decoding_run(tokens_: list[int]) -> Run:
    run = Run(
        req=Request(prompt=tokens_, sampling=GREEDY, max_tokens=-1),
        slot=0,
        tokens=list(tokens_),
        n_prompt=len(tokens_),
        n_computed=len(tokens_),
    )
    run.sampler = SamplerState(GREEDY, tokens_, set())
    return run


def test_backoff_after_rejections() -> None:
    spec = Speculator(BOTH, 256)
    run = _decoding_run([1, 2, 3])
    run.spec = SpecRun()
    skips = []
    for _ in range(7):
        spec.record(run, 4, 0)
        skips.append(run.spec.skip)
    assert skips == [1, 2, 4, 8, 16, 16, 16] and MAX_BACKOFF == 16
    assert run.spec.cap == 2  # a rejected draft halves the next one
    spec.record(run, 2, 2)
    assert run.spec.backoff == 1 and run.spec.cap == 5  # accepted in full: 2c + 1


def test_backoff_never_caps_below_n_min() -> None:
    """ngram-mod's drafts are at least n_min long: a rejection halves the cap, but the
    cap never drops below n_min (which would end that sequence's drafting for good)."""
    spec = Speculator(dataclasses.replace(MOD, ngram_mod_n_min=4, ngram_mod_n_max=8), 256)
    history = [1, *range(10, 30), *range(10, 20)]
    run = _decoding_run(history)
    spec.propose([run], 512)
    assert len(run.draft) == FIRST_CAP == 7  # the first drafts are short
    spec.record(run, 7, 0)
    spec.record(run, 4, 0)
    assert run.spec is not None and run.spec.cap == 2
    run.spec.skip = 0
    spec.propose([run], 512)
    assert len(run.draft) == 4


def test_long_draft_limits_make_whole_four_row_tiles() -> None:
    """A limit of FIRST_CAP or more is rounded down so that draft + decode row is a multiple
    of 4 rows; shorter limits, and a rounding that would fall below n_min, stay as they are."""
    history = [1, *range(10, 60), *range(10, 20)]  # a long copy follows 17 18 19
    cfg = dataclasses.replace(MOD, ngram_mod_n_min=1, ngram_mod_n_max=40)
    spec = Speculator(cfg, 256)
    run = _decoding_run(history)
    run.spec = SpecRun(cap=16)
    spec.propose([run], 512)
    assert len(run.draft) == 15  # 16 rows, not 17
    run.spec.cap = 10
    spec.propose([run], 512)
    assert len(run.draft) == 7
    run.spec.cap = 5  # below FIRST_CAP: as it is
    spec.propose([run], 512)
    assert len(run.draft) == 5
    floor = Speculator(dataclasses.replace(cfg, ngram_mod_n_min=9), 256)
    run.spec = SpecRun(cap=10)  # rounding to 7 would fall below n_min 9
    floor.propose([run], 512)
    assert len(run.draft) == 10


def test_the_longest_ngram_draft_wins() -> None:
    """A loop of period 5: ngram-simple's match runs into the present after 4 tokens, while
    ngram-mod's chain goes round the loop up to its n_max; the sequence takes the longer
    draft, and ngram-simple's where it is the longer one (or on a tie)."""
    loop = [7, 8, 9, 10, 11]
    cfg = SpecConfig(
        types=("ngram-simple", "ngram-mod"),
        ngram_simple_size_n=3,
        ngram_simple_size_m=8,
        ngram_mod_n_match=3,
        ngram_mod_n_min=1,
        ngram_mod_n_max=8,
    )
    history = [1, *range(20, 40), *loop, *loop, *loop]
    simple = ngram_simple_draft(history, 3, 8)
    assert simple == [7, 8, 9, 10]  # stops where its match (a period back) meets the present
    run = _decoding_run(history)
    run.spec = SpecRun(cap=8)
    Speculator(cfg, 256).propose([run], 512)
    assert run.draft == (loop * 2)[:7]  # ngram-mod's chain, 7 (+ the decode row = 8 rows)
    copy = [1, *range(20, 40), 5, 6, 7, *range(50, 60), 5, 6, 7]  # no loop: a plain copy
    run = _decoding_run(copy)
    run.spec = SpecRun(cap=8)
    Speculator(dataclasses.replace(cfg, ngram_mod_n_max=2), 256).propose([run], 512)
    assert run.draft == ngram_simple_draft(copy, 3, 8)[:7] == list(range(50, 57))


def test_no_drafts_in_a_large_batch() -> None:
    spec = Speculator(BOTH, 256)
    history = [1, *range(10, 30), *range(10, 20)]  # what follows 17 18 19 is 20 21 ...
    runs = [_decoding_run(history) for _ in range(MAX_BATCH + 1)]
    spec.propose(runs, 512)
    assert all(r.draft == [] for r in runs)
    spec.propose(runs[:MAX_BATCH], 512)
    assert all(r.draft[:3] == [20, 21, 22] for r in runs[:MAX_BATCH])
    spec.propose(runs[:2], 2 + 3)  # the token budget: one row each, 3 draft rows in all
    assert sum(len(r.draft) for r in runs[:2]) == 3


def test_ngram_simple_finds_what_llama_cpp_finds() -> None:
    """The packed search (`TokenBytes`, `bytes.rfind`) and the plain scan of llama.cpp's
    loop agree, on small alphabets (many matches, some across token boundaries) and
    large token ids."""
    rng = random.Random(0)
    for _ in range(2000):
        alphabet = rng.choice([2, 3, 5, 300, 70_000])
        history = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 80))]
        n, m = rng.randrange(1, 5), rng.randrange(1, 8)
        packed = TokenBytes()
        packed.sync(history[: len(history) // 2])
        packed.sync(history)
        assert ngram_simple_draft(history, n, m, packed) == ngram_simple_draft(history, n, m)
    assert ngram_simple_draft([1, 5, 6, 7, 8, 9, 5, 6], 2, 3) == [7, 8, 9]
