"""Activated LoRA (aLoRA) through the engine on a tiny Gemma 3.

The oracle is PEFT's own aLoRA (``LoraConfig(alora_invocation_tokens=...)``, transformers
float32): the adapter acts from the start of the last occurrence of its invocation sequence
in the prompt on. The adapter is written in the test as a PEFT folder and in llama.cpp's
GGUF form (``adapter.alora.invocation_tokens``). The history before the invocation is
computed under the base model, so its KV is shared with base requests both ways
(`cache_n`), and every answer equals its cache-off answer.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.lora.adapter import AdapterError
from loraserve.model.loader import LoadedModel
from tests.engine_util import ask, run_and_drain, tokens
from tests.unit.lora.alora_util import INV
from tests.unit.lora.catalogue_util import N, greedy

HISTORY = [1, 5, 77, 300, 12, 9, 260, 261, 200, 150, 33, 41, 42, 43]  # 14 tokens


@functools.cache
def _peft_greedy(pm: torch.nn.Module, prompt: tuple[int, ...], n: int) -> list[int]:
    return peft_greedy(pm, list(prompt), n, cached=False)


def peft_greedy(pm: torch.nn.Module, prompt: list[int], n: int = N, cached=True) -> list[int]:
    """PEFT's aLoRA, greedy: active from the invocation's start in the prompt on."""
    if cached:
        return _peft_greedy(pm, tuple(prompt), n)
    start = max(i for i in range(len(prompt) - 1) if prompt[i : i + 2] == INV)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            out = pm(torch.tensor([ids]), alora_offsets=[len(ids) - start]).logits[0]
            ids.append(int(out[-1].argmax()))
    return ids[len(prompt) :]


def one(eng: Engine, prompt: list[int], **kw) -> tuple[list[int], int]:
    (evs,) = run_and_drain(eng, [ask(prompt, N, **kw)])
    assert evs[-1].error is None, evs[-1].error
    return tokens(evs), evs[-1].timings.cache_n


def engine(model: LoadedModel) -> Engine:
    return Engine(model, EngineConfig(n_ctx=512, block_size=4, n_slots=2))


@pytest.mark.parametrize("form", [0, 1], ids=["peft", "gguf"])
def test_alora_equals_peft(tiny, alora, form: int) -> None:
    model, m = tiny
    eng = engine(model)
    a = eng.load_adapter(alora[form], 0.0).result()
    assert a.alora == tuple(INV)
    pm = alora[2]
    for prompt in (HISTORY + INV + [50, 51], HISTORY[:3] + INV + HISTORY + INV + [60]):
        got, _ = one(eng, prompt, lora=[(a.id, 1.0)])
        assert got == peft_greedy(pm, prompt) != greedy(m, prompt)
    no_invocation = HISTORY + [50, 51]  # the adapter never acts: the base model's answer
    assert one(eng, no_invocation, lora=[(a.id, 1.0)])[0] == greedy(m, no_invocation)


def test_base_history_is_shared_both_ways(tiny, alora) -> None:
    model, m = tiny
    asked = HISTORY + INV + [50, 51]
    # base first, then the aLoRA request that continues the same history
    eng = engine(model)
    a = eng.load_adapter(alora[0], 0.0).result()
    one(eng, HISTORY + [99])
    got, cache_n = one(eng, asked, lora=[(a.id, 1.0)])
    assert cache_n >= len(HISTORY) and got == peft_greedy(alora[2], asked)
    # the aLoRA request first, then a base request over the same history
    eng = engine(model)
    a = eng.load_adapter(alora[0], 0.0).result()
    one(eng, asked, lora=[(a.id, 1.0)])
    base, cache_n = one(eng, HISTORY + [99])
    assert cache_n >= len(HISTORY) and base == greedy(m, HISTORY + [99])
    # and never the adapter's positions: a base request over the invocation recomputes them
    _, cache_n = one(eng, asked)
    assert cache_n == len(HISTORY)


def test_malformed_invocation_is_refused(tiny, alora, tmp_path) -> None:
    model, _ = tiny
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(alora[0], bad)
    conf = json.loads((bad / "adapter_config.json").read_text())
    conf["alora_invocation_tokens"] = ["x"]
    (bad / "adapter_config.json").write_text(json.dumps(conf))
    with pytest.raises(AdapterError, match="invocation"):
        engine(model).load_adapter(bad).result()
