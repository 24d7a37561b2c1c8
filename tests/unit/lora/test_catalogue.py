"""The adapter catalogue and its memory tiers, through the engine on a tiny Gemma 3.

Adapters are written in the test (PEFT folders with random A and B, and their llama.cpp
GGUF form) into a `--lora-dir`. The oracle for an adapter's answer is PEFT's own model
(transformers float32, greedy); the tiers are checked against the engine's answers with the
same adapter loaded explicitly and never evicted, bit for bit, and against the cache's own
counters (`cache_n`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from loraserve.engine.engine import Engine
from loraserve.lora.adapter import AdapterError
from loraserve.lora.catalogue import Catalogue, parse_module
from loraserve.lora.registry import UnknownModelName
from tests.engine_util import ask, run_and_drain, tokens
from tests.unit.lora.catalogue_util import N, P, engine, first_uses_at_once, greedy
from tests.unit.lora.lora_util import peft_adapter


def one(eng: Engine, **kw) -> tuple[list[int], int]:
    """Tokens and cache_n of one greedy request of P."""
    (evs,) = run_and_drain(eng, [ask(kw.pop("prompt", P), N, **kw)])
    assert evs[-1].error is None, evs[-1].error
    return tokens(evs), evs[-1].timings.cache_n


def test_catalogue_lists_and_finds(lib, tmp_path) -> None:
    root, _ = lib
    outside = tmp_path / "x.gguf"
    shutil.copy(root / "e.gguf", outside)
    os.symlink(outside, root / "link.gguf")  # leads outside the directory: not offered
    try:
        cat = Catalogue([str(root)], [parse_module('{"name": "Mod", "path": "/p"}')])
        assert [e.name for e in cat.list()] == ["Mod", "a", "b", "c", "d", "e"]
        assert cat.lookup("A").path == (root / "a").resolve()
        assert cat.lookup("e").path.name == "e.gguf" and cat.lookup("mod").path == Path("/p")
        assert cat.lookup("link") is None and cat.lookup("nope") is None
    finally:
        (root / "link.gguf").unlink()
    assert parse_module("x=/a/b") == ("x", "/a/b", None)
    for bad in ("x", "=p", '{"name": 1}', "{nope"):
        with pytest.raises(ValueError):
            parse_module(bad)


def test_first_use_by_model_and_by_lora_name(tiny, lib) -> None:
    model, m = tiny
    root, peft = lib
    eng = engine(model, root)
    assert eng.core.adapters.list() == []
    got, _ = one(eng, adapter_name="a")  # an OpenAI `model` naming a catalogue entry
    assert got == greedy(peft["a"], P)
    got, _ = one(eng, lora=[("B", 1.0)])  # a `lora` entry by name, case ignored
    assert got == greedy(peft["b"], P)
    gguf, _ = one(eng, lora=[("e", 1.0)])  # the GGUF form of a: the same content
    assert gguf == greedy(peft["a"], P)
    names = {a.name: a for a in eng.core.adapters.list()}
    assert sorted(names) == ["a", "b", "e"] and names["a"].content_id == names["e"].content_id
    assert greedy(m, P) != greedy(peft["a"], P) != greedy(peft["b"], P)  # not vacuous


def test_missing_and_bad_names_fail_clearly(tiny, lib, tmp_path) -> None:
    model, _ = tiny
    root, _ = lib
    bad = tmp_path / "lib"
    shutil.copytree(root / "a", bad / "broken")
    (bad / "broken" / "adapter_model.safetensors").write_bytes(b"not safetensors")
    eng = engine(model, bad)
    with pytest.raises(UnknownModelName, match="'nope'"):
        eng.submit(**ask(P, 2, lora=[("nope", 1.0)])).received.result()
    with pytest.raises(AdapterError, match="broken"):
        eng.submit(**ask(P, 2, lora=[("broken", 1.0)])).received.result()
    assert eng.core.adapters.list() == []  # a failed first read registers nothing
    assert eng.core.adapters.stats.load_failures == 1
    with pytest.raises(UnknownModelName):
        eng.submit(**ask(P, 2), adapter_name="nope", strict_name=True).received.result()


def test_concurrent_first_uses_read_once(tiny, lib) -> None:
    model, _ = tiny
    root, peft = lib
    eng = engine(model, root, n_slots=4)
    eng.start()
    try:
        answers = first_uses_at_once(eng, "c")
    finally:
        eng.shutdown()
    assert answers == [greedy(peft["c"], P)] * 4
    assert eng.core.adapters.stats.loads == 1


def test_eviction_is_lru_and_reload_is_exact_and_warm(tiny, lib) -> None:
    model, _ = tiny
    root, _ = lib
    eng = engine(model, root, lora_max_loaded=2)
    reg = eng.core.adapters
    first, cache_n = one(eng, adapter_name="a")
    assert cache_n == 0
    one(eng, adapter_name="b")
    one(eng, adapter_name="a")  # a used after b: b is the least recently used
    one(eng, adapter_name="c")
    assert {x.name for x in reg.resident} == {"a", "c"} and reg.stats.evictions == 1
    one(eng, adapter_name="d")  # now a is the oldest
    assert {x.name for x in reg.resident} == {"c", "d"}
    loads = reg.stats.loads
    again, cache_n = one(eng, adapter_name="a")  # read again from disk
    assert reg.stats.loads == loads + 1
    assert again == first and cache_n == len(P) - 1  # its KV stayed warm under its content


def test_changed_file_never_reuses_old_kv(tiny, lib, tmp_path) -> None:
    model, m = tiny
    root, _ = lib
    mine = tmp_path / "lib"
    shutil.copytree(root / "a", mine / "x")
    shutil.copytree(root / "b", mine / "y")
    eng = engine(model, mine, lora_max_loaded=1)
    one(eng, adapter_name="x")
    one(eng, adapter_name="y")  # x goes back to disk
    assert [a.name for a in eng.core.adapters.resident] == ["y"]
    _, pm = peft_adapter(mine / "x", m, seed=9)
    got, cache_n = one(eng, adapter_name="x")
    assert cache_n == 0 and got == greedy(pm, P) != greedy(lib[1]["a"], P)


def test_pinned_and_in_use_never_evicted(tiny, lib) -> None:
    model, _ = tiny
    root, peft = lib
    eng = engine(model, root, lora_max_loaded=1, n_slots=3)
    reg = eng.core.adapters
    pinned = eng.load_adapter(root / "d", 0.0, "pin", pinned=True).result()
    # three requests under three adapters queued at once: each is read while the others
    # are in use, so nothing may go until they finish (an evicted adapter would answer
    # with the base model's tokens)
    evs = run_and_drain(eng, [ask(P, N, adapter_name=n) for n in "abc"])
    assert [tokens(e) for e in evs] == [greedy(peft[n], P) for n in "abc"]
    eng.step()  # idle now: the overflow is evicted, the pinned adapter stays
    assert [a.name for a in reg.resident] == ["pin"] and pinned.weights


def test_memory_budget_and_shared_content(tiny, lib, tmp_path) -> None:
    model, _ = tiny
    root, _ = lib
    mine = tmp_path / "lib"
    for n in "ab":
        shutil.copytree(root / n, mine / n)
    shutil.copytree(root / "a", mine / "a2")  # same content as a under another name
    eng = engine(model, mine)  # an adapter's size first
    one(eng, adapter_name="a")
    size = eng.core.adapters.resident_bytes
    eng = engine(model, mine, lora_max_mib=1.5 * size / 2**20)
    reg = eng.core.adapters
    one(eng, adapter_name="a")
    one(eng, adapter_name="a2")  # shares a's weights: no second copy, no eviction
    assert reg.stats.shared_loads == 1 and reg.resident_bytes == size
    assert reg.stats.evictions == 0
    one(eng, adapter_name="b")  # over the budget: a and a2 (least recently used) go
    assert [a.name for a in reg.resident] == ["b"] and reg.resident_bytes == size
