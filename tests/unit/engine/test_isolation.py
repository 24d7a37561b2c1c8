"""Isolation: a request that fails inside the engine fails alone.

Failures are injected two ways: a runner that raises whenever one request is in the batch,
and a LoRA adapter (loaded through the registry) whose huge weights drive its rows to
inf/NaN. The other requests of the same batches finish with the tokens they get alone,
the failed one gets a clear error, the engine thread lives on, and the KV pool holds no
block that neither a slot nor the prefix cache owns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.request import Request
from loraserve.engine.runner import BatchItem
from loraserve.engine.sampling.params import SamplingParams
from tests.engine_util import drain, follow, run_one, tokens
from tests.server_util import peft_folder, serve_in_thread, tiny_model

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
MARK = 300  # a token that only the faulty request's prompt holds
PROMPTS = [[1, 17, 23, 42, 5, 9], [1, 17, 23, 42, 77], [1, 260, 261, 262, 263, 264, 265, 266]]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("iso-loras")
    return {
        "good": peft_folder(d / "good", 1),
        "huge": peft_folder(d / "huge", 2, magnitude=1e37),  # finite, overflows in use
    }


def engine(adapters: dict[str, Path] | None = None, n_slots: int = 4) -> Engine:
    eng = Engine(tiny_model(), EngineConfig(n_slots=n_slots, n_ctx=256 * n_slots, block_size=4))
    for path in (adapters or {}).values():
        eng.load_adapter(path, 0.0).result()  # ids 0, 1, ... in the fixture's order
    return eng


def request(
    eng: Engine,
    prompt: list[int],
    mix: dict[int, float] | None = None,
    n: int = 12,
    sampling: SamplingParams = GREEDY,
) -> Request:
    """Submit one request (every adapter's global scale is 0: no mix is the base model)."""
    lora = list(mix.items()) if mix else None
    return eng.submit([prompt], sampling, max_tokens=n, lora=lora).requests[0]


def alone(prompt: list[int], mix: dict[int, float], ads: dict[str, Path], n: int = 12) -> list:
    """Reference: the request on a fresh engine of its own (nothing cached, no batch)."""
    return run_one(engine(ads, n_slots=1), prompt, n, mix, sampling=GREEDY)


def check_pool(eng: Engine) -> None:
    """Idle engine: every used block is held by a slot or cached in the index."""
    core = eng.core
    core.cache.check()
    held = {b for s in core.scheduler.slots for b in s.blocks}
    assert not core.scheduler.running
    assert core.pool.num_used == len(held) + core.cache.num_cached()
    for b in held:
        assert core.pool.refcount[b] == sum(b in s.blocks for s in core.scheduler.slots)


def failing_runner(eng: Engine, when: Callable[[BatchItem], bool]) -> list[int]:
    """Make the runner raise for every forward that holds an item matching ``when``;
    returns a list of the sizes of the batches that raised."""
    forward, raised = eng.core.runner.forward, []

    def patched(items):
        if any(when(it) for it in items):
            raised.append(len(items))
            raise RuntimeError("injected failure")
        return forward(items)

    eng.core.runner.forward = patched  # type: ignore[method-assign]
    return raised


@pytest.mark.parametrize("at", ["prefill", "decode"])
def test_forward_exception_fails_only_its_request(at: str) -> None:
    eng = engine()
    bad_prompt = [1, MARK, 17, 23, 42]
    decode_at = len(bad_prompt) + 2  # fails after three generated tokens

    def culprit(it: BatchItem) -> bool:
        return it.tokens[1] == MARK and (at == "prefill" or it.start >= decode_at)

    raised = failing_runner(eng, culprit)
    bad = request(eng, bad_prompt)
    reqs = [request(eng, p) for p in PROMPTS]
    eng.run_until_idle()
    assert max(raised) == 4, "the faulty request never shared a batch"
    evs = drain(bad)
    assert evs[-1].error and "injected failure" in evs[-1].error
    assert len(tokens(evs)) == (0 if at == "prefill" else 3)
    for p, r in zip(PROMPTS, reqs, strict=True):
        out = drain(r)
        assert out[-1].error is None and tokens(out) == alone(p, {}, {})
    check_pool(eng)
    again = request(eng, PROMPTS[0])  # cache hits on what the batch computed stay exact
    eng.run_until_idle()
    assert tokens(drain(again)) == alone(PROMPTS[0], {}, {})
    check_pool(eng)


def test_huge_adapter_fails_only_its_request(adapters, caplog) -> None:
    eng = engine(adapters)
    good, huge = 0, 1
    bad = request(eng, [1, 17, 23, 42, 5, 9, 11, 13], {huge: 1.0})  # first: owns block 0
    jobs = [(PROMPTS[0], {}), (PROMPTS[1], {good: 1.0}), (PROMPTS[2], {good: 0.5})]
    reqs = [request(eng, p, m) for p, m in jobs]
    with caplog.at_level(logging.WARNING, logger="loraserve.engine"):
        eng.run_until_idle()
    evs = drain(bad)
    assert evs[-1].error == "the model produced non-finite logits for this request"
    assert not tokens(evs)
    for (p, m), r in zip(jobs, reqs, strict=True):
        out = drain(r)
        assert out[-1].error is None and tokens(out) == alone(p, m, adapters)
    # one batched step failed (the huge adapter's rows poisoned the other LoRA rows); its
    # KV was scrubbed, so later padded decode steps never read it again
    assert sum("running its" in m for m in caplog.messages) == 1
    check_pool(eng)


def test_engine_thread_survives_and_serves(adapters) -> None:
    eng = engine(adapters)
    raised = failing_runner(eng, lambda it: it.tokens[1] == MARK)
    eng.start()
    try:
        bad = request(eng, [1, MARK, 5])
        good = request(eng, PROMPTS[2], {0: 1.0})
        assert bad.events.get(timeout=30).error
        evs = follow(good)
        assert tokens(evs) == alone(PROMPTS[2], {0: 1.0}, adapters)
        assert raised and eng._thread is not None and eng._thread.is_alive()
        later = request(eng, PROMPTS[0])
        evs = follow(later)
        assert evs[-1].error is None and len(tokens(evs)) == 12
    finally:
        eng.shutdown()


def test_over_http_the_bad_request_gets_a_clear_error(adapters) -> None:
    folder = adapters["good"].parent
    args = ["-np", "4", "-c", "1024", "--temp", "0", "--lora-dir", str(folder)]
    with serve_in_thread(args) as srv:
        ids = {}
        for name in ("good", "huge"):
            r = srv.client.post("/lora-adapters/load", json={"path": name, "scale": 0.0})
            assert r.status_code == 200, r.text
            ids[name] = r.json()["id"]
        body = {"prompt": "the cat and the", "n_predict": 16, "ignore_eos": True}
        jobs = [None, {"id": ids["good"], "scale": 1.0}, {"id": ids["huge"], "scale": 1.0}]
        refs = [
            srv.client.post(
                "/completion", json={**body, "cache_prompt": False, "lora": [j] if j else []}
            ).json()
            for j in jobs[:2]
        ]
        results: list = [None] * len(jobs)

        def send(i: int) -> None:
            lora = [jobs[i]] if jobs[i] else []
            results[i] = srv.client.post("/completion", json={**body, "lora": lora})

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        bad = results[2]
        assert bad.status_code == 500, bad.text
        assert bad.json()["error"]["type"] == "server_error"
        assert "non-finite logits" in bad.json()["error"]["message"]
        for ref, got in zip(refs, results[:2], strict=True):
            assert got.status_code == 200 and got.json()["content"] == ref["content"]
        assert srv.client.get("/health").json() == {"status": "ok"}
        engine_ = srv.app.state.server.engine
        assert engine_._thread is not None and engine_._thread.is_alive()
        check = srv.client.post("/completion", json=body)
        assert check.status_code == 200 and check.json()["content"] == refs[0]["content"]


def test_sampling_failure_fails_only_its_request(monkeypatch) -> None:
    import loraserve.engine.isolation as isolation

    eng = engine()
    real, seed = isolation.sample_batch, 4242  # the faulty request is the one with this seed

    def sample_batch(logits, states, top=None):
        if any(s.params.seed == seed for s in states):
            raise ValueError("injected sampling failure")
        return real(logits, states, top)

    monkeypatch.setattr(isolation, "sample_batch", sample_batch)
    bad = request(eng, [1, 5, 6], sampling=SamplingParams(temperature=0.0, seed=seed))
    reqs = [request(eng, p) for p in PROMPTS]
    eng.run_until_idle()
    assert "injected sampling failure" in (drain(bad)[-1].error or "")
    for p, r in zip(PROMPTS, reqs, strict=True):
        assert tokens(drain(r)) == alone(p, {}, {})
    check_pool(eng)


def test_a_failing_step_outside_the_forward_pass_leaves_the_thread_alive() -> None:
    eng = engine()
    schedule, failed = eng.core.scheduler.schedule, []

    def once():
        if not failed and eng.core.scheduler.running:
            failed.append(True)
            raise RuntimeError("injected scheduler failure")
        return schedule()

    eng.core.scheduler.schedule = once  # type: ignore[method-assign]
    eng.start()
    try:
        first = request(eng, PROMPTS[0])
        ev = first.events.get(timeout=30)
        assert ev.done and "injected scheduler failure" in (ev.error or "")
        later = request(eng, PROMPTS[1])
        evs = follow(later)
        assert evs[-1].error is None and tokens(evs) == alone(PROMPTS[1], {}, {})
    finally:
        eng.shutdown()
    check_pool(eng)


def test_bad_rows_flags_inf_and_nan_but_not_huge_finite_logits() -> None:
    """The fast row-sum check must not call a row whose finite logits overflow the sum
    bad, and must flag every row with an inf (either sign), a NaN, or inf - inf."""
    from loraserve.engine.isolation import _bad_rows

    x = torch.randn(6, 1000)
    x[0, :2] = 3e38  # finite, but the row sum overflows
    x[1, 5] = float("inf")
    x[2, 7] = -float("inf")
    x[3, 9] = float("nan")
    x[4, 1], x[4, 2] = float("inf"), -float("inf")
    assert _bad_rows(x).tolist() == [False, True, True, True, True, False]
