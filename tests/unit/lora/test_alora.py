"""Activated LoRA (aLoRA) through the engine on a tiny Gemma 3.

The oracle is PEFT's own aLoRA (``LoraConfig(alora_invocation_tokens=...)``, transformers
float32): the adapter acts from the start of the last occurrence of its invocation sequence
in the prompt on. The adapter is written in the test as a PEFT folder and in llama.cpp's
GGUF form (``adapter.alora.invocation_tokens``). The history before the invocation is
computed under the base model, so its KV is shared with base requests both ways
(`cache_n`), and every answer equals its cache-off answer.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFValueType, GGUFWriter
from peft import LoraConfig, get_peft_model

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.lora.adapter import AdapterError
from loraserve.model.loader import LoadedModel, load_model
from tests.engine_util import ask, run_and_drain, tokens
from tests.tiny import hf_logits, hf_model, write_gguf
from tests.unit.lora.lora_util import TARGETS, peft_pairs

INV = [7, 8]
HISTORY = [1, 5, 77, 300, 12, 9, 260, 261, 200, 150, 33, 41, 42, 43]  # 14 tokens
N = 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[LoadedModel, torch.nn.Module]:
    m = hf_model("gemma3", num_hidden_layers=2, seed=3)
    return load_model(write_gguf(tmp_path_factory.mktemp("m") / "g.gguf", m, "gemma3")), m


@pytest.fixture(scope="module")
def alora(tiny, tmp_path_factory) -> tuple[Path, Path, torch.nn.Module]:
    """PEFT's aLoRA (folder, its GGUF form, the PEFT model)."""
    _, m = tiny
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS, alora_invocation_tokens=INV,
        task_type="CAUSAL_LM",
    )  # fmt: skip
    pm = get_peft_model(copy.deepcopy(m), cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    root = tmp_path_factory.mktemp("alora")
    pm.save_pretrained(root / "inv")
    assert (
        json.loads((root / "inv" / "adapter_config.json").read_text())["alora_invocation_tokens"]
        == INV
    )
    return root / "inv", gguf_alora(root / "inv.gguf", root / "inv"), pm.eval()


def gguf_alora(path: Path, folder: Path) -> Path:
    """llama.cpp's converter output for an aLoRA folder (gemma3: no q/k permutation)."""
    from loraserve.model.hf import hf_to_gguf_name

    w = GGUFWriter(str(path), "gemma3")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 8.0)
    w.add_key_value(
        "adapter.alora.invocation_tokens", INV, GGUFValueType.ARRAY, GGUFValueType.UINT32
    )
    for hf_name, (a, b) in peft_pairs(folder).items():
        name = hf_to_gguf_name(hf_name, "gemma3")
        w.add_tensor(name + ".lora_a", a.numpy().astype(np.float32))
        w.add_tensor(name + ".lora_b", b.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


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


def base_greedy(m: torch.nn.Module, prompt: list[int], n: int = N) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(hf_logits(m, ids)[-1].argmax()))
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
        assert got == peft_greedy(pm, prompt) != base_greedy(m, prompt)
    no_invocation = HISTORY + [50, 51]  # the adapter never acts: the base model's answer
    assert one(eng, no_invocation, lora=[(a.id, 1.0)])[0] == base_greedy(m, no_invocation)


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
    assert cache_n >= len(HISTORY) and base == base_greedy(m, HISTORY + [99])
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
