"""Embedding requests through the engine: every pooling equals transformers' final hidden
states pooled the same way (the oracle), alone, chunked, batched with completions, and
under a LoRA mix (PEFT's model with the adapter)."""

from __future__ import annotations

import pytest
import torch

from loraserve.engine.embedding import Pooling, normalize
from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from loraserve.model.loader import LoadedModel, load_model
from tests.engine_util import ask, random_prompts, run_and_drain
from tests.tiny import hf_model, write_gguf
from tests.unit.lora.lora_util import peft_adapter

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[LoadedModel, torch.nn.Module]:
    m = hf_model("gemma3", num_hidden_layers=4, seed=5)
    path = write_gguf(tmp_path_factory.mktemp("tiny") / "g.gguf", m, "gemma3")
    return load_model(path, "float32"), m


def hf_hidden(m: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """transformers' final-norm hidden states [T, hidden]."""
    with torch.no_grad():
        out = m(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0].float()


def pooled(h: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    return {
        Pooling.NONE: h,
        Pooling.MEAN: h.mean(0, keepdim=True),
        Pooling.CLS: h[:1],
        Pooling.LAST: h[-1:],
        Pooling.RANK: h[-1:],
    }[pooling]


def embed(engine: Engine, prompt: list[int], pooling: Pooling, **kw) -> torch.Tensor:
    [evs] = run_and_drain(engine, [ask(prompt, 0, pooling=pooling, **kw)])
    assert len(evs) == 1 and evs[0].error is None and evs[0].embedding is not None
    return evs[0].embedding


@pytest.mark.parametrize("pooling", list(Pooling))
def test_each_pooling_equals_transformers(tiny, pooling) -> None:
    model, m = tiny
    eng = Engine(model, EngineConfig(n_slots=2, n_ctx=512, ubatch=7))  # chunked prefill
    for p in random_prompts(11, 3):
        ours = embed(eng, p, pooling)
        assert torch.allclose(ours, pooled(hf_hidden(m, p), pooling), atol=2e-4)


def test_batched_with_completions_and_cache(tiny) -> None:
    """Embeddings and completions in one batch: each equals its result alone; a `last`
    embedding may reuse the completion's cached prefix and is still exact."""
    model, m = tiny
    eng = Engine(model, EngineConfig(n_slots=4, n_ctx=1024))
    ps = random_prompts(12, 3)
    alone = [run_and_drain(eng, [ask(ps[0], 6)])[0]]
    out = run_and_drain(
        eng,
        [
            ask(ps[0], 6),
            ask(ps[1], 0, pooling=Pooling.MEAN),
            ask(ps[2], 0, pooling=Pooling.NONE),
            ask(ps[0] + [5, 6], 0, pooling=Pooling.LAST),
        ],
    )
    assert [e.token for e in out[0]] == [e.token for e in alone[0]]
    assert torch.allclose(
        out[1][-1].embedding, pooled(hf_hidden(m, ps[1]), Pooling.MEAN), atol=2e-4
    )
    assert torch.allclose(out[2][-1].embedding, hf_hidden(m, ps[2]), atol=2e-4)
    last = embed(eng, ps[0] + [5, 6], Pooling.LAST)  # cached prefix this time
    assert torch.allclose(last, hf_hidden(m, ps[0] + [5, 6])[-1:], atol=2e-4)
    assert out[3][-1].n_prompt == len(ps[0]) + 2


def test_under_a_lora_mix(tiny, tmp_path) -> None:
    model, m = tiny
    folder, pm = peft_adapter(tmp_path / "a", m, seed=3)
    eng = Engine(model, EngineConfig(n_slots=2, n_ctx=512))
    adapter = eng.load_adapter(folder, 0.0).result()
    p = random_prompts(13, 1)[0]
    with_lora = embed(eng, p, Pooling.MEAN, lora=[(adapter.id, 1.0)])
    base = embed(eng, p, Pooling.MEAN)
    assert torch.allclose(with_lora, pooled(hf_hidden(pm, p), Pooling.MEAN), atol=2e-4)
    assert not torch.allclose(with_lora, base, atol=1e-3)


def test_normalize_as_llama_cpp() -> None:
    v = torch.tensor([[3.0, -4.0]])
    assert torch.allclose(normalize(v, 2), torch.tensor([[0.6, -0.8]]))
    assert torch.equal(normalize(v, -1), v)
    assert torch.allclose(normalize(v, 0), v * 32760 / 4)
    assert torch.allclose(normalize(v, 1), v / 7)
    assert torch.equal(normalize(torch.zeros(1, 2), 2), torch.zeros(1, 2))
