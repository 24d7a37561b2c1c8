"""The benchmark's workload generators: deterministic, exact sizes, the right distributions."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from bench.workloads import (
    GEMMA_USER,
    AdapterShapes,
    adapter_tensors,
    chat_workload,
    distinct_mixes,
    mix_lora,
    percentile,
    poisson_arrivals,
    prompt_tokens,
    write_adapters,
    zipf_choices,
    zipf_weights,
)
from loraserve.model.gguf import GGUFFile


def encode(text: str) -> list[int]:
    """A stand-in tokenizer: one id per character."""
    return [ord(ch) for ch in text]


TINY = AdapterShapes(n_layers=2, hidden=8, q_out=16, kv_out=4, ffn=12)


@pytest.mark.parametrize("n", [1, 7, 200, 512])
def test_prompt_tokens_exact_length_and_deterministic(n: int) -> None:
    a = prompt_tokens(encode, n, seed=3, prefix=[2])
    assert len(a) == n and a[0] == 2
    assert a == prompt_tokens(encode, n, seed=3, prefix=[2])
    if n >= 100:
        assert a != prompt_tokens(encode, n, seed=4, prefix=[2])


def test_prompt_tokens_longer_is_extension() -> None:
    assert prompt_tokens(encode, 300, seed=1)[:100] == prompt_tokens(encode, 100, seed=1)


def test_adapter_tensors_shapes_dtype_and_seed() -> None:
    t = adapter_tensors(5, TINY, rank=4)
    assert len(t) == 2 * 7 * 2
    assert t["blk.0.attn_q.weight.lora_a"].shape == (4, 8)
    assert t["blk.0.attn_q.weight.lora_b"].shape == (16, 4)
    assert t["blk.1.attn_output.weight.lora_a"].shape == (4, 16)
    assert t["blk.1.ffn_down.weight.lora_b"].shape == (8, 4)
    assert t["blk.1.attn_k.weight.lora_b"].shape == (4, 4)
    assert all(v.dtype.name == "float16" for v in t.values())
    again = adapter_tensors(5, TINY, rank=4)
    other = adapter_tensors(6, TINY, rank=4)
    assert all((again[k] == v).all() for k, v in t.items())
    assert any((other[k] != v).any() for k, v in t.items())


def test_default_shapes_are_gemma3_270m() -> None:
    names = {n: (i, o) for n, i, o in AdapterShapes().projections()}
    assert names == {
        "attn_q": (640, 1024),
        "attn_k": (640, 256),
        "attn_v": (640, 256),
        "attn_output": (1024, 640),
        "ffn_gate": (640, 2048),
        "ffn_up": (640, 2048),
        "ffn_down": (2048, 640),
    }


def test_write_adapters_gguf_metadata_and_reuse(tmp_path) -> None:
    paths = write_adapters(tmp_path, 3, rank=4, seed=10, shapes=TINY)
    assert len(set(paths)) == 3
    with GGUFFile(paths[1]) as g:
        meta = g.metadata
        assert meta["general.architecture"] == "gemma3"
        assert meta["general.type"] == "adapter"
        assert meta["adapter.type"] == "lora"
        assert meta["adapter.lora.alpha"] == pytest.approx(4.0)
        assert g.tensors["blk.0.ffn_up.weight.lora_a"].shape == (4, 8)
        a = g.tensor("blk.0.ffn_up.weight.lora_a").numpy()
    expected = adapter_tensors(11, TINY, rank=4)["blk.0.ffn_up.weight.lora_a"]
    assert (a == expected.astype("float32")).all()
    mtime = paths[0].stat().st_mtime_ns
    assert write_adapters(tmp_path, 3, rank=4, seed=10, shapes=TINY) == paths
    assert paths[0].stat().st_mtime_ns == mtime


def test_mix_lora_lists_every_id() -> None:
    assert mix_lora(((2, 0.5),), 4) == [
        {"id": 0, "scale": 0.0},
        {"id": 1, "scale": 0.0},
        {"id": 2, "scale": 0.5},
        {"id": 3, "scale": 0.0},
    ]
    assert mix_lora((), 2) == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]
    mixes = distinct_mixes(4, 8)
    assert len(set(mixes)) == 4
    with pytest.raises(ValueError):
        distinct_mixes(9, 8)


def test_zipf_weights_and_choices() -> None:
    w = zipf_weights(16, 1.1)
    assert sum(w) == pytest.approx(1.0)
    assert all(a > b for a, b in zip(w, w[1:], strict=False))
    assert w[0] / w[1] == pytest.approx(2**1.1)
    draws = zipf_choices(16, 5000, seed=1)
    assert draws == zipf_choices(16, 5000, seed=1)
    counts = Counter(draws)
    assert counts[0] > counts[1] > counts[4] > counts[15]
    assert counts[0] / 5000 == pytest.approx(w[0], abs=0.03)
    assert set(draws) <= set(range(16))


def test_poisson_arrivals() -> None:
    t = poisson_arrivals(2.0, 4000, seed=9)
    assert t == poisson_arrivals(2.0, 4000, seed=9)
    assert all(b > a for a, b in zip(t, t[1:], strict=False)) and t[0] > 0
    gaps = [b - a for a, b in zip([0.0, *t], t, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.5, rel=0.06)
    assert statistics.stdev(gaps) == pytest.approx(0.5, rel=0.1)
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 3, seed=1)


def test_chat_workload_interleaved_pinned_shared_system() -> None:
    mixes = [((0, 1.0),), ((1, 1.0),), ((2, 0.5),)]
    sessions, turns = chat_workload(
        encode, n_users=3, n_turns=2, system_tokens=50, mixes=mixes, seed=4, bos=[2]
    )
    assert [(t.user, t.turn) for t in turns] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert all(t.mix == mixes[t.user] and t.alt_mix is None for t in turns)
    assert all(len(s.history) == 50 and s.history == sessions[0].history for s in sessions)
    assert sessions[0].history[0] == 2
    text = "".join(map(chr, turns[0].suffix))
    assert text.startswith("<start_of_turn>user\n")
    assert text.endswith(GEMMA_USER.split("{text}")[1])
    again = chat_workload(
        encode, n_users=3, n_turns=2, system_tokens=50, mixes=mixes, seed=4, bos=[2]
    )
    assert [t.suffix for t in again[1]] == [t.suffix for t in turns]


def test_chat_workload_regenerates_under_another_mix() -> None:
    mixes = [((0, 1.0),), ((1, 1.0),)]
    _, turns = chat_workload(
        encode, n_users=2, n_turns=1, system_tokens=10, mixes=mixes, seed=0, regenerate=True
    )
    assert [(t.mix, t.alt_mix) for t in turns] == [(mixes[0], mixes[1]), (mixes[1], mixes[0])]


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(101)), 95) == pytest.approx(95.0)
