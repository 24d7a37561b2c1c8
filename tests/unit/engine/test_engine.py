"""Engine behaviour on a tiny model: batching, chunking, prefix reuse, stops."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.request import StopType
from loraserve.engine.sampling.params import SamplingParams
from loraserve.model.loader import LoadedModel, load_model
from tests.engine_util import ask, random_prompts, run_and_drain, run_one, tokens
from tests.tiny import gguf_tensors, hf_logits, hf_model, write_gguf
from tests.unit.lora.lora_util import peft_adapter


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[LoadedModel, torch.nn.Module]:
    m = hf_model("gemma3", num_hidden_layers=6, seed=3)
    path = write_gguf(tmp_path_factory.mktemp("tiny") / "g.gguf", m, "gemma3")
    return load_model(path), m


def test_greedy_equals_transformers(tiny) -> None:
    model, hf = tiny
    p = random_prompts(0, 1)[0]
    got = tokens(run_and_drain(Engine(model, EngineConfig(n_ctx=256)), [ask(p, 10)])[0])
    ids = list(p)
    for _ in range(10):
        ids.append(int(hf_logits(hf, ids)[-1].argmax()))
    assert got == ids[len(p) :]


@pytest.mark.parametrize("ubatch", [512, 7])
def test_batch_invariance(tiny, ubatch: int) -> None:
    model, _ = tiny
    ps = random_prompts(1, 6)
    alone = [run_one(Engine(model, EngineConfig(n_ctx=512)), p, 12) for p in ps]
    eng = Engine(model, EngineConfig(n_slots=4, n_ctx=1024, ubatch=ubatch))
    together = [tokens(e) for e in run_and_drain(eng, [ask(p, 12) for p in ps])]
    assert together == alone


def test_prefix_reuse_is_exact(tiny) -> None:
    model, _ = tiny
    p = random_prompts(2, 1)[0] + [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    eng = Engine(model, EngineConfig(n_ctx=512, block_size=4))
    cold = run_and_drain(eng, [ask(p, 6, cache_prompt=False)])[0]
    first = run_and_drain(eng, [ask(p, 6)])[0]
    second = run_and_drain(eng, [ask(p, 6)])[0]
    assert tokens(first) == tokens(second) == tokens(cold)
    seq_timings = eng.core.scheduler.slots[0].last_request
    assert seq_timings is not None
    # a prompt that diverges mid-block reuses exactly the common prefix (copy-on-write)
    q = p[:10] + [300, 301, 302]
    fresh = Engine(model, EngineConfig(n_ctx=512, block_size=4))
    assert run_one(eng, q, 6) == run_one(fresh, q, 6)
    assert eng.core.cache.stats.hit_tokens >= (len(p) - 1) + 10


def test_cache_keys_do_not_mix(tiny, tmp_path) -> None:
    model, hf = tiny
    eng = Engine(model, EngineConfig(n_ctx=512, block_size=4))
    folder, _ = peft_adapter(tmp_path / "x", hf, target_modules=["q_proj", "v_proj"])
    x = eng.load_adapter(folder, 0.0).result()
    p = random_prompts(4, 1)[0]
    run_and_drain(eng, [ask(p, 4, lora=[(x.id, 1.0)])])
    hits = eng.core.cache.stats.hit_tokens
    run_and_drain(eng, [ask(p, 4)])  # base key: nothing computed under it yet
    assert eng.core.cache.stats.hit_tokens == hits


def test_stops_and_limits(tiny) -> None:
    model, _ = tiny
    eng = Engine(model, EngineConfig(n_ctx=64))
    p = random_prompts(5, 1)[0]
    full = run_and_drain(eng, [ask(p, 12)])[0]
    assert full[-1].stop_type == StopType.LIMIT and len(tokens(full)) == 12
    text = "".join(e.text for e in full)
    if len(text) > 4:
        stop = text[2:4]
        evs = run_and_drain(eng, [ask(p, 12, stop=(stop,))])[0]
        assert evs[-1].stop_type == StopType.WORD and evs[-1].stopping_word == stop
        assert "".join(e.text for e in evs) == text[: text.find(stop)]
    eos = tokens(full)[0]
    eng.eog_ids = frozenset({eos})  # requests submitted from now on end at that token
    evs = run_and_drain(eng, [ask(p, 12)])[0]
    assert evs[-1].stop_type == StopType.EOS and tokens(evs) == []  # EOG text is not output
    # the context limit ends generation
    long = run_and_drain(Engine(model, EngineConfig(n_ctx=len(p) + 3)), [ask(p, -1)])[0]
    assert long[-1].stop_type == StopType.LIMIT and len(tokens(long)) == 3


def test_unified_kv_lets_every_slot_use_the_whole_context(tiny) -> None:
    """-c 128 -np 4 gives each slot 32 tokens; with --kv-unified each may use all 128, and
    its tokens are those of a one-slot engine with the same context."""
    model, _ = tiny
    p = random_prompts(5, 1)[0]
    split = run_and_drain(Engine(model, EngineConfig(n_slots=4, n_ctx=128)), [ask(p, 40)])[0]
    assert split[-1].stop_type == StopType.LIMIT and len(tokens(split)) == 32 - len(p)
    unified = Engine(model, EngineConfig(n_slots=4, n_ctx=128, kv_unified=True))
    runs = run_and_drain(unified, [ask(p, 40) for _ in range(4)])
    alone = run_one(Engine(model, EngineConfig(n_slots=1, n_ctx=128)), p, 40)
    assert all(tokens(evs) == alone and len(alone) == 40 for evs in runs)


def test_cancel_frees_slot_and_blocks(tiny) -> None:
    model, _ = tiny
    eng = Engine(model, EngineConfig(n_slots=2, n_ctx=256, cache_ram_mib=0))
    (a,) = eng.submit(**ask(random_prompts(6, 1)[0], 50)).requests
    eng.submit(**ask(random_prompts(7, 1)[0], 5))
    eng.step()
    eng.cancel(a)
    eng.run_until_idle()
    core = eng.core
    assert not any(s.busy for s in core.scheduler.slots)
    held = sum(len(s.blocks) for s in core.scheduler.slots)
    assert core.pool.num_used == held  # nothing leaked beyond what idle slots retain
    core.cache.check()


def test_seeded_sampling_is_batch_independent(tiny) -> None:
    model, _ = tiny
    sp = SamplingParams(temperature=1.0, seed=42, top_k=0, top_p=1.0, min_p=0.0)
    p = random_prompts(8, 1)[0]
    alone = run_one(Engine(model, EngineConfig(n_ctx=256)), p, 10, sampling=sp)
    others = [ask(q, 10, sampling=SamplingParams(temperature=1.0)) for q in random_prompts(9, 3)]
    eng = Engine(model, EngineConfig(n_slots=4, n_ctx=1024))
    together = run_and_drain(eng, [*others[:2], ask(p, 10, sampling=sp), others[2]])
    assert tokens(together[2]) == alone


@pytest.mark.parametrize("quantized", [False, True])
def test_next_turn_reuses_the_answers_kv_and_equals_cache_off(
    tiny, tmp_path, quantized: bool
) -> None:
    """A chat's next turn (prompt + answer + more) reuses the answer's KV: decode computes
    bitwise what a prefill of the same tokens does, on float and on quantized weights, so
    the turn equals its cache-off run."""
    model, hf = tiny
    if quantized:
        q = {n: GGMLQuantizationType.Q5_0 for n in gguf_tensors(hf, "gemma3") if "norm" not in n}
        model = load_model(
            write_gguf(
                tmp_path / "q.gguf", hf_model("gemma3", num_hidden_layers=6, seed=3), "gemma3", q
            )
        )
        assert model.decoder.blocks[0].qkv.parts[0].quantized  # the quantized kernels run
    eng = Engine(model, EngineConfig(n_ctx=512, block_size=4))
    p = random_prompts(7, 1)[0]
    answer = tokens(run_and_drain(eng, [ask(p, 8)])[0])
    turn = p + answer + [40, 41, 42]
    evs = run_and_drain(eng, [ask(turn, 6)])[0]
    cold = run_and_drain(Engine(model, EngineConfig(n_ctx=512, block_size=4)), [ask(turn, 6)])[0]
    assert tokens(evs) == tokens(cold)
    assert evs[-1].n_cached == len(p) + len(answer) - 1
