"""Preemption for fairness (`engine/preemption.py`): with every slot busy, a request that has
waited past the bound takes a slot from a running one, which resumes later by recomputation.

The bound is set so small here that the requests are preempted at nearly every step, each
one many times, with the prefix cache keeping their KV (`cache_ram` large) or not (`0`:
the resumed run recomputes everything it had). The oracle is each request run alone on a
fresh engine: every event (token, text, probabilities, final event's counts and stop) of a
preempted request is the same, so its client sees no token twice and none lost.
"""

from __future__ import annotations

import pytest

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.request import Event
from loraserve.engine.sampling.params import SamplingParams
from tests.engine_util import drain
from tests.server_util import tiny_model

SAMPLED = SamplingParams(temperature=0.9, seed=5, n_probs=3, ignore_eos=True)
GREEDY = SamplingParams(temperature=0.0, n_probs=2, ignore_eos=True)
ASKS = [  # (prompt, max tokens, sampling): odd lengths, so blocks end part full
    ([1, 17, 23, 42, 5, 9, 11], 16, SAMPLED),
    ([1, 260, 261, 262, 263], 7, GREEDY),
    ([1, 17, 23, 42, 77, 78, 79, 80, 81, 82, 83], 10, SAMPLED),
    ([1, 5, 6], 12, GREEDY),
]


def engine(n_slots: int, cache_ram_mib: float, preempt_after_s: float = 0.0) -> Engine:
    cfg = EngineConfig(
        n_slots=n_slots,
        n_ctx=128 * n_slots,
        block_size=4,
        ubatch=6,  # long recomputations take several steps
        cache_ram_mib=cache_ram_mib,
        preempt_after_s=preempt_after_s,
    )
    return Engine(tiny_model(), cfg)


def seen(evs: list[Event]) -> list[tuple]:
    """What a client reads of each event (timings and slot ids aside)."""
    return [
        (e.token, e.text, e.probs, e.prob, e.done, e.error, e.stop_type, e.n_prompt)
        + (e.n_generated,)
        for e in evs
    ]


def alone(prompt: list[int], n: int, sampling: SamplingParams) -> list[tuple]:
    eng = engine(1, 64)
    (req,) = eng.submit([prompt], sampling, max_tokens=n).requests
    eng.run_until_idle()
    return seen(drain(req))


@pytest.fixture(scope="module")
def reference() -> list[list[tuple]]:
    return [alone(*a) for a in ASKS]


@pytest.mark.parametrize("cache_ram_mib", [64, 0], ids=["cached", "recomputed"])
@pytest.mark.parametrize("n_slots", [1, 2])
def test_preempted_requests_answer_as_alone(
    reference: list[list[tuple]], n_slots: int, cache_ram_mib: float
) -> None:
    eng = engine(n_slots, cache_ram_mib, preempt_after_s=1e-9)
    reqs = [eng.submit([p], s, max_tokens=n).requests[0] for p, n, s in ASKS]
    steps = 0
    while eng.core.busy:
        eng.step()
        steps += 1
        assert steps < 1000, "no progress"
    pre = eng.core.scheduler.preemption
    assert pre.n_preempted >= 2 * len(ASKS)  # each one out of its slot again and again
    assert [seen(drain(r)) for r in reqs] == reference
    assert not pre.suspended and not pre.catchup
    assert eng.core.scheduler.queue.queued == 0
    eng.core.cache.check()


def test_no_preemption_before_the_bound(reference: list[list[tuple]]) -> None:
    eng = engine(1, 64, preempt_after_s=3600)
    reqs = [eng.submit([p], s, max_tokens=n).requests[0] for p, n, s in ASKS]
    eng.run_until_idle()
    assert eng.core.scheduler.preemption.n_preempted == 0
    assert [seen(drain(r)) for r in reqs] == reference


def test_a_request_cancelled_while_preempted_ends_cleanly(reference: list[list[tuple]]) -> None:
    eng = engine(1, 64, preempt_after_s=1e-9)
    first, second = (eng.submit([p], s, max_tokens=n).requests[0] for p, n, s in ASKS[:2])
    while not eng.core.scheduler.preemption.suspended:
        eng.step()
    (gone,) = eng.core.scheduler.preemption.suspended.values()
    eng.cancel(gone.req)
    eng.run_until_idle()
    assert not eng.core.scheduler.preemption.suspended and not eng.core._outputs
    other = second if gone.req is first else first
    assert seen(drain(other)) == reference[[first, second].index(other)]
    eng.core.cache.check()
