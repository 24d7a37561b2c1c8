"""The cache invariant under the catalogue, the tiers and aLoRA (hypothesis): random
sequences of requests (adapters named on first use, aLoRA with and without its invocation,
mixes of both, shared histories), global scale switches and evictions (`--lora-max-loaded
1` evicts at nearly every switch) keep every answer equal to its cache-off answer: the
same mix on a reference engine with the adapters loaded explicitly and the prefix cache
off. After each batch the prefix cache's own invariants hold (`PrefixCache.check`).
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.model.loader import LoadedModel, load_model
from tests.engine_util import ask, run_and_drain, tokens
from tests.tiny import hf_model, write_gguf
from tests.unit.lora.alora_util import INV
from tests.unit.lora.lora_util import peft_adapter

HISTORY = [1, 5, 77, 300, 12, 9, 260, 261, 200]
MIXES = [{}, {"a": 1.0}, {"b": 0.5}, {"inv": 1.0}, {"a": 1.0, "inv": 1.0}, None]  # None: global
N = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[LoadedModel, torch.nn.Module]:
    m = hf_model("gemma3", num_hidden_layers=2, seed=3)
    return load_model(write_gguf(tmp_path_factory.mktemp("m") / "g.gguf", m, "gemma3")), m


@pytest.fixture(scope="module")
def lib(tiny, alora, tmp_path_factory):
    import shutil

    _, m = tiny
    root = tmp_path_factory.mktemp("lib")
    peft_adapter(root / "a", m, seed=1)
    peft_adapter(root / "b", m, seed=2)
    shutil.copytree(alora[0], root / "inv")
    return root


@pytest.fixture(scope="module")
def reference(tiny, lib):
    """Cache-off answers: every adapter loaded by path, the prefix cache unused."""
    model, _ = tiny
    eng = Engine(model, EngineConfig(n_ctx=256, block_size=4, cache_ram_mib=0))
    ids = {n: eng.load_adapter(lib / n, 0.0, n).result().id for n in ("a", "b", "inv")}

    @functools.cache
    def answer(mix: tuple[tuple[str, float], ...], prompt: tuple[int, ...]) -> list[int]:
        lora = [(ids[n], s) for n, s in mix] or None
        (evs,) = run_and_drain(eng, [ask(list(prompt), N, lora=lora, cache_prompt=False)])
        return tokens(evs)

    return answer


prompts = st.builds(
    lambda k, inv, tail: HISTORY[:k] + (INV if inv else []) + tail,
    st.integers(2, len(HISTORY)),
    st.booleans(),
    st.lists(st.sampled_from([3, 4, 7, 8]), max_size=4),
)
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("ask"),
            st.lists(st.tuples(st.sampled_from(MIXES), prompts), min_size=1, max_size=2),
        ),
        st.tuples(st.just("global"), st.sampled_from(MIXES[:5])),
    ),
    min_size=2,
    max_size=5,
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=ops)
def test_every_answer_equals_cache_off(tiny, lib, reference, seq) -> None:
    model, _ = tiny
    eng = Engine(
        model,
        EngineConfig(n_slots=2, n_ctx=512, block_size=4, lora_dirs=(str(lib),), lora_max_loaded=1),
    )
    reg = eng.core.adapters
    for op, arg in seq:
        if op == "global":  # names the catalogue offers, registered on disk if need be
            items = [(reg.lookup(n).id, s) for n, s in arg.items()]
            eng.set_global_scales(items).result()
            continue
        asks = [
            ask(p, N, lora=list(mix.items()) or [(reg.lookup("a").id, 0.0)])
            if mix is not None
            else ask(p, N)
            for mix, p in arg
        ]
        subs = [eng.submit(**a) for a in asks]
        eng.run_until_idle()
        for sub, (_, p) in zip(subs, arg, strict=True):
            scales = sub.received.result().scales
            named = tuple(sorted((reg.get(i).name, s) for i, s in scales.items()))
            evs = []
            while not sub.requests[0].events.empty():
                evs.append(sub.requests[0].events.get())
            assert evs[-1].error is None, evs[-1].error
            assert tokens(evs) == reference(named, tuple(p)), (named, p)
        eng.core.cache.check()
    eng.step()  # idle: the tiers' limit holds again
    assert len(reg.resident) <= 1
