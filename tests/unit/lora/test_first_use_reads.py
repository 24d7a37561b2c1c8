"""First use of a catalogue adapter while the engine runs: its file is read off the engine
thread, and requests that do not need it keep decoding, to their end, while the read waits;
the request that named it then answers as PEFT does. Queued requests keep their adapters:
with one slot and `--lora-max-loaded 1`, three requests under three adapters queue behind
each other, each adapter is read once and none goes back to disk before its request ran.
An evicted adapter whose file is deleted fails its next use by name, alone.

The oracle is transformers' (PEFT's) greedy answer (`catalogue_util.greedy`).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from loraserve.lora import registry as registry_mod
from loraserve.lora.registry import UnknownModelName
from tests.engine_util import ask, follow, run_and_drain, tokens
from tests.unit.lora.catalogue_util import N, P, engine, greedy

LONG = 24  # tokens of the request that decodes while the read waits


def test_others_decode_to_their_end_while_an_adapter_is_read(tiny, lib, monkeypatch) -> None:
    model, m = tiny
    root, peft = lib
    entered, release = threading.Event(), threading.Event()
    real = registry_mod.load_adapter

    def held(path, *args, **kw):  # type: ignore[no-untyped-def]
        if Path(path).name == "c":  # the read of c waits until the test lets it go
            entered.set()
            assert release.wait(120)
        return real(path, *args, **kw)

    monkeypatch.setattr(registry_mod, "load_adapter", held)
    eng = engine(model, root, n_slots=4)
    eng.start()
    try:
        named = eng.submit(**ask(P, N), adapter_name="c")
        assert entered.wait(60)  # c's read began (on a reader, not the engine thread)
        base = eng.submit(**ask(P, LONG))  # submitted after it
        base_evs = follow(base.requests[0], timeout=120)
        assert len(tokens(base_evs)) == LONG and base_evs[-1].error is None
        assert entered.is_set() and not release.is_set()  # all while c's read waited
        assert not named.received.done()  # parked: no step ran it without its adapter
        release.set()
        got = tokens(follow(named.requests[0], timeout=120))
    finally:
        release.set()
        eng.shutdown()
    assert got == greedy(peft["c"], P)
    assert tokens(base_evs) == greedy(m, P, LONG)
    assert eng.core.adapters.stats.loads == 1


def test_queued_requests_keep_their_adapters(tiny, lib) -> None:
    model, _ = tiny
    root, peft = lib
    eng = engine(model, root, n_slots=1, lora_max_loaded=1)
    reg = eng.core.adapters
    evs = run_and_drain(eng, [ask(P, N, adapter_name=n) for n in "abc"])
    assert [tokens(e) for e in evs] == [greedy(peft[n], P) for n in "abc"]
    assert reg.stats.loads == 3  # each read once: none evicted while its request queued
    eng.step()  # idle: back under the limit, the least recently used gone
    assert len(reg.resident) == 1 and reg.stats.evictions == 2


def test_a_file_gone_after_eviction_is_an_unknown_name(tiny, lib, tmp_path) -> None:
    """An adapter evicted and then deleted on disk: its next use fails naming it (the
    server's 404), the others still answer, and a copy put back is read again."""
    model, _ = tiny
    root, peft = lib
    mine = tmp_path / "lib"
    for n in "ab":
        shutil.copytree(root / n, mine / n)
    eng = engine(model, mine, lora_max_loaded=1)
    run_and_drain(eng, [ask(P, N, adapter_name="a")])
    run_and_drain(eng, [ask(P, N, adapter_name="b")])  # a goes back to disk
    shutil.rmtree(mine / "a")
    with pytest.raises(UnknownModelName, match="'a'"):
        eng.submit(**ask(P, N), adapter_name="a").received.result()
    (evs,) = run_and_drain(eng, [ask(P, N, adapter_name="b")])
    assert tokens(evs) == greedy(peft["b"], P)
    shutil.copytree(root / "a", mine / "a")
    (evs,) = run_and_drain(eng, [ask(P, N, adapter_name="a")])
    assert tokens(evs) == greedy(peft["a"], P)
