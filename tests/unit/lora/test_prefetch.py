"""Adapter reads started at submit time (`lora.prefetch`): the engine uses the read of an
unchanged file once, never one of a file changed since, and the held reads stay bounded.

The oracle for the engine's answers is PEFT's own model (transformers float32, greedy), as
in test_catalogue; for `Prefetch` alone it is the file's bytes on disk."""

from __future__ import annotations

import os
import threading
import time

from loraserve.lora import prefetch as pf
from loraserve.lora.prefetch import Prefetch, disk_path, will_need
from tests.engine_util import ask, follow, run_and_drain, tokens
from tests.unit.lora.catalogue_util import N, P, engine, first_uses_at_once, greedy


def deferred() -> tuple[Prefetch, list]:
    """A Prefetch that reads a file's bytes, its jobs held until the test runs them."""
    jobs: list = []
    return Prefetch(lambda p: p.read_bytes(), jobs.append), jobs  # type: ignore[arg-type, return-value]


def test_claim_serves_an_unchanged_file_once(tmp_path) -> None:
    f = tmp_path / "x.gguf"
    f.write_bytes(b"first")
    fetch, jobs = deferred()
    fetch.start(f)
    fetch.start(f)  # the same file again: the read already held serves both
    assert len(jobs) == 1 and fetch.started == 1
    jobs.pop()()
    held = fetch.claim(f)
    assert held is not None and held.result()[0] == f.read_bytes()
    assert fetch.claim(f) is None  # taken out: a second claim reads for itself
    fetch.start(f)  # the engine reads the path now (claimed, not finished): none starts
    assert jobs == []
    fetch.finish(f)
    fetch.start(f)
    assert len(jobs) == 1


def test_a_file_changed_since_the_read_started_is_never_served(tmp_path) -> None:
    f = tmp_path / "x.gguf"
    f.write_bytes(b"old content")
    fetch, jobs = deferred()
    fetch.start(f)
    jobs.pop()()
    f.write_bytes(b"new content, another size")
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert fetch.claim(f) is None  # the caller reads the new bytes itself
    gone = tmp_path / "gone.gguf"
    fetch.start(gone)  # no file: nothing starts (the engine's read names the error)
    assert jobs == [] and fetch.claim(gone) is None
    will_need(gone)  # a hint only: nothing to read is no error


def test_a_pool_shut_down_holds_nothing(tmp_path) -> None:
    f = tmp_path / "x.gguf"
    f.write_bytes(b"bytes")

    def shut(job) -> None:
        raise RuntimeError("cannot schedule new futures after shutdown")

    fetch = Prefetch(lambda p: p.read_bytes(), shut)  # type: ignore[arg-type, return-value]
    fetch.start(f)  # no error for the submitter, and no read that would never end
    assert fetch.claim(f) is None
    held, jobs = deferred()
    held.start(f)
    held.clear()  # what close does: the jobs were cancelled with the pool
    assert held.claim(f) is None and len(jobs) == 1


def test_unclaimed_reads_are_bounded(tmp_path, monkeypatch) -> None:
    fetch, jobs = deferred()
    files = []
    for i in range(pf.MAX_UNCLAIMED + 4):
        files.append(tmp_path / f"a{i}.gguf")
        files[-1].write_bytes(b"x" * i)
        fetch.start(files[-1])
    assert len(jobs) == pf.MAX_UNCLAIMED + 4
    assert fetch.claim(files[0]) is None  # the oldest were dropped
    assert fetch.claim(files[-1]) is not None
    monkeypatch.setattr(pf, "TTL_S", -1.0)  # everything held is past its time
    fetch.start(files[1])
    assert sum(fetch.claim(x) is not None for x in files[2:]) == 0


def test_submit_reads_once_and_answers_as_peft(tiny, lib) -> None:
    model, _ = tiny
    root, peft = lib
    eng = engine(model, root, n_slots=4)
    reg = eng.core.adapters
    assert disk_path(reg, "c") == (root / "c").resolve()  # a catalogue name, not registered
    assert disk_path(reg, "nope") is None
    eng.start()
    engine_nice = os.getpriority(os.PRIO_PROCESS, eng.thread_native_id) + 3
    os.setpriority(os.PRIO_PROCESS, eng.thread_native_id, engine_nice)  # as the server does
    try:
        answers = first_uses_at_once(eng, "c")
        again = eng.submit(**ask(P, N), lora=[(reg.find("c").id, 1.0)])
        assert tokens(follow(again.requests[0])) == answers[0]
        readers = [t.native_id for t in eng.loads._pool._threads]  # spawned by the clients
        assert readers and {os.getpriority(os.PRIO_PROCESS, t) for t in readers} == {engine_nice}
    finally:
        eng.shutdown()
    assert answers == [greedy(peft["c"], P)] * 4
    assert reg.stats.loads == 1 and eng.loads.prefetch.claimed == 1
    assert disk_path(reg, "c") is None  # resident: nothing to read at submit


def test_an_adapter_a_submission_names_is_kept_until_received(tiny, lib) -> None:
    model, _ = tiny
    root, peft = lib
    eng = engine(model, root, lora_max_loaded=1)
    reg = eng.core.adapters

    def answer(**kw) -> list[int]:
        (evs,) = run_and_drain(eng, [ask(P, N, **kw)])
        return tokens(evs)

    first = answer(adapter_name="a")
    eng.loads.inbox.threaded = True  # as at submit with an engine thread: not received yet
    try:
        eng.loads.want([("A", 1.0)], None)
    finally:
        eng.loads.inbox.threaded = False
    eng.loads.close()
    b = answer(adapter_name="b")
    # a is the least recently used, but wanted: b, idle once answered, went instead
    assert [x.name for x in reg.resident] == ["a"] and reg.stats.evictions == 1
    again = answer(lora=[("A", 1.0)])  # the receipt: read no more
    assert reg.stats.loads == 2
    c = answer(adapter_name="c")
    assert [x.name for x in reg.resident] == ["c"] and reg.stats.loads == 3
    assert again == first == greedy(peft["a"], P)
    assert b == greedy(peft["b"], P) and c == greedy(peft["c"], P)


def test_readers_take_the_engines_nice_plus_the_offset(monkeypatch) -> None:
    from loraserve.engine import adapter_loads as al

    loads = al.AdapterLoads.__new__(al.AdapterLoads)
    loads.engine_tid = threading.get_native_id()  # this thread stands in for the engine
    base = os.getpriority(os.PRIO_PROCESS, loads.engine_tid)

    def reader_nice(offset: int) -> int:
        monkeypatch.setattr(al, "READER_NICE", offset)
        seen: list[int] = []

        def reader() -> None:  # a pool's initializer, as the read pool runs it
            loads._like_engine()
            seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

        t = threading.Thread(target=reader)
        t.start()
        t.join()
        return seen[0]

    assert reader_nice(0) == base
    assert reader_nice(3) == min(19, base + 3)
    assert reader_nice(40) == 19  # clamped to the lowest priority there is
