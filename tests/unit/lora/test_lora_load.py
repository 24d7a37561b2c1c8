"""Adapter loading (formats, refusals) and the registry's ids, scales and cache keys."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from loraserve.lora.adapter import AdapterError
from loraserve.lora.registry import AdapterRegistry
from tests.unit.lora.lora_util import IDS, R, gguf_adapter, lora_logits, pairs, peft_adapter


def test_gguf_types_and_alpha(llama, tmp_path) -> None:
    _, model = llama
    t = pairs()
    v, up = "blk.0.attn_v.weight", "blk.1.ffn_up.weight"
    types = {
        v + ".lora_a": Q.Q8_0,
        v + ".lora_b": Q.F16,
        up + ".lora_a": Q.BF16,
        up + ".lora_b": Q.BF16,
    }
    reg = AdapterRegistry(model)
    ad = reg.load(gguf_adapter(tmp_path / "q.gguf", "llama", t, alpha=6.0, types=types))
    for name, qt in types.items():
        target, _, part = name.rpartition(".")
        got = getattr(ad.weights[target], part[-1])
        want = dequantize(quantize(t[name].numpy(), qt), qt)
        assert np.array_equal(got.numpy(), want), name
    assert ad.weights["blk.0.attn_v.weight"].factor == 6.0 / R
    no_alpha = reg.load(gguf_adapter(tmp_path / "n.gguf", "llama", t, alpha=None))
    zero = reg.load(gguf_adapter(tmp_path / "z.gguf", "llama", t, alpha=0.0))
    assert no_alpha.weights["blk.1.ffn_up.weight"].factor == zero.weights[
        "blk.1.ffn_up.weight"
    ].factor == 1.0  # fmt: skip
    assert no_alpha.content_id == zero.content_id != ad.content_id


def _truncated(tmp_path: Path) -> Path:
    p = gguf_adapter(tmp_path / "t.gguf", "llama", pairs())
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 600])
    return p


def _peft_with(tmp_path: Path, m, edit) -> Path:
    folder, _ = peft_adapter(tmp_path / "p", m, target_modules=["v_proj"])
    f = folder / "adapter_model.safetensors"
    save_file(edit(load_file(f)), f)
    return folder


def _corrupt(tmp_path: Path, m) -> Path:
    folder, _ = peft_adapter(tmp_path / "c", m, target_modules=["v_proj"])
    f = folder / "adapter_model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    return folder


V = "base_model.model.model.layers.0.self_attn.v_proj"
BAD = {
    "wrong-arch": (lambda p, m: gguf_adapter(p / "a.gguf", "qwen2", pairs()), "'qwen2'"),
    "wrong-shape": (
        lambda p, m: gguf_adapter(p / "a.gguf", "llama", pairs(**{
            "blk.0.attn_v.weight": ((R, 64), (64, R))})),
        "'blk.0.attn_v.weight'",
    ),
    "rank-mismatch": (
        lambda p, m: gguf_adapter(p / "a.gguf", "llama", pairs(**{
            "blk.0.attn_v.weight": ((R, 64), (32, R + 1))})),
        "'blk.0.attn_v.weight'",
    ),
    "missing-lora_b": (
        lambda p, m: gguf_adapter(p / "a.gguf", "llama", {
            k: v for k, v in pairs().items() if k != "blk.1.ffn_up.weight.lora_b"}),
        "blk.1.ffn_up.weight.lora_b is missing",
    ),
    "unknown-target": (
        lambda p, m: gguf_adapter(p / "a.gguf", "llama", pairs(**{
            "blk.7.attn_q.weight": ((R, 64), (64, R))})),
        "'blk.7.attn_q.weight' does not exist",
    ),
    "token-embd": (
        lambda p, m: gguf_adapter(p / "a.gguf", "llama", pairs(**{
            "token_embd.weight": ((320, R), (64, R))})),
        "'token_embd.weight'",
    ),
    "bad-suffix": (
        lambda p, m: gguf_adapter(p / "a.gguf", "llama", {**pairs(), "blk.0.x": np.zeros(4)}),
        "'blk.0.x'",
    ),
    "truncated": (lambda p, m: _truncated(p), "truncated"),
    "missing-file": (lambda p, m: p / "nothing.gguf", "no such"),
    "peft-unknown-module": (
        lambda p, m: _peft_with(p, m, lambda sd: {k.replace("v_proj", "w_proj"): v
                                                  for k, v in sd.items()}),
        "w_proj' is not a known base tensor",
    ),
    "peft-missing-B": (
        lambda p, m: _peft_with(p, m, lambda sd: {k: v for k, v in sd.items()
                                                  if k != V + ".lora_B.weight"}),
        "v_proj.lora_B is missing",
    ),
    "peft-embedding": (
        lambda p, m: _peft_with(p, m, lambda sd: {**sd, "base_model.model.model.embed_tokens"
                                                  ".lora_embedding_A": torch.zeros(R, 320)}),
        "'token_embd.weight'",
    ),
    "peft-corrupt": (lambda p, m: _corrupt(p, m), "cannot read safetensors"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_adapter_is_refused_and_changes_nothing(llama, tmp_path, case: str) -> None:
    m, model = llama
    make, needle = BAD[case]
    reg = AdapterRegistry(model)
    before = lora_logits(model, reg, IDS[:6], {})
    with pytest.raises(AdapterError) as err:
        reg.load(make(tmp_path, m), scale=1.0)
    assert needle in str(err.value), str(err.value)
    assert reg.list() == [] and reg.global_scales == {}
    assert torch.equal(lora_logits(model, reg, IDS[:6], {}), before)
    assert reg.load(gguf_adapter(tmp_path / "ok.gguf", "llama", pairs())).id == 0


def test_model_file_is_not_an_adapter(llama, tmp_path) -> None:
    _, model = llama
    with pytest.raises(AdapterError, match="not a LoRA adapter"):
        AdapterRegistry(model).load(model.path)


def test_registry_ids_names_and_global_scales(llama, tmp_path) -> None:
    _, model = llama
    reg = AdapterRegistry(model)
    a = reg.load(gguf_adapter(tmp_path / "a.gguf", "llama", pairs(0)))
    b = reg.load(gguf_adapter(tmp_path / "b.gguf", "llama", pairs(1)), scale=0.5, name="bee")
    assert (a.id, a.name, b.id, b.name) == (0, "a", 1, "bee")
    assert reg.global_scales == {0: 1.0, 1: 0.5}
    reg.unload(0)
    c = reg.load(tmp_path / "a.gguf", scale=0.0)
    assert c.id == 2 and [x.id for x in reg.list()] == [1, 2]  # ids are never reused
    with pytest.raises(ValueError, match="id 0"):
        reg.get(0)
    reg.set_global([(2, 0.25)])
    assert reg.global_scales == {1: 0.0, 2: 0.25}
    with pytest.raises(ValueError, match="id 7"):
        reg.set_global([(1, 1.0), (7, 1.0)])
    assert reg.global_scales == {1: 0.0, 2: 0.25}  # a bad list changes nothing
    with pytest.raises(ValueError, match="finite"):
        reg.set_global([(1, float("nan"))])
    assert reg.build_delta([]) is None


def test_resolve_rules(llama, tmp_path) -> None:
    _, model = llama
    reg = AdapterRegistry(model)
    for i in range(3):
        reg.load(gguf_adapter(tmp_path / f"{i}.gguf", "llama", pairs(i)), scale=[1.0, 0.0, -2][i])
    snapshot = reg.resolve(None)
    assert snapshot == reg.resolve([]) == {0: 1.0, 2: -2.0}
    reg.set_global([(1, 3.0)])
    assert snapshot == {0: 1.0, 2: -2.0}  # a snapshot, not a view
    assert reg.resolve(None) == {1: 3.0}
    assert reg.resolve([(2, 0.5)]) == {2: 0.5}  # unlisted -> 0, not the global scale
    assert reg.resolve([(0, 1.0), (0, 0.0), (2, 1.0), (2, -1.5)]) == {2: -1.5}  # last wins
    assert reg.resolve([(0, 0.0)]) == {}  # an explicit all-zero list means the base model
    with pytest.raises(ValueError, match="id 9"):
        reg.resolve([(9, 1.0)])


def test_cache_key_is_canonical(llama, tmp_path) -> None:
    _, model = llama
    reg = AdapterRegistry(model)
    path = gguf_adapter(tmp_path / "a.gguf", "llama", pairs(0))
    a, a2 = reg.load(path), reg.load(path)
    b = reg.load(gguf_adapter(tmp_path / "b.gguf", "llama", pairs(1)))
    assert reg.cache_key({}) == reg.cache_key({0: 0.0, 2: 0.0}) == ()
    assert reg.cache_key({0: 0.5}) == reg.cache_key({1: 0.5}) == ((a.content_id, 0.5),)
    assert reg.cache_key({0: 0.5, 2: 1.0}) == reg.cache_key({2: 1.0, 0: 0.5, 1: 0.0})
    assert reg.cache_key({0: 0.5, 2: 1.0}) == tuple(sorted(
        [(a.content_id, 0.5), (b.content_id, 1.0)]))  # fmt: skip
    assert reg.cache_key({0: 0.5}) != reg.cache_key({0: -0.5})
    assert a.content_id == a2.content_id != b.content_id
    shutil.copy(tmp_path / "b.gguf", path)  # the same path now holds other weights
    reloaded = reg.load(path)
    assert reloaded.content_id == b.content_id != a.content_id
    assert reg.cache_key({reloaded.id: 0.5}) != reg.cache_key({a.id: 0.5})


SCALES = st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.0, -0.25])
ITEMS = st.lists(st.tuples(st.integers(0, 2), SCALES), max_size=6)


@pytest.fixture(scope="module")
def registry(llama, tmp_path_factory) -> AdapterRegistry:
    """Ids 0 and 1 load the same file; id 2 another."""
    d = tmp_path_factory.mktemp("reg")
    reg = AdapterRegistry(llama[1])
    same = gguf_adapter(d / "s.gguf", "llama", pairs(0))
    for p in (same, same, gguf_adapter(d / "o.gguf", "llama", pairs(1))):
        reg.load(p)
    return reg


@settings(max_examples=200, deadline=None)
@given(req=st.none() | ITEMS, global_items=ITEMS)
def test_resolve_and_cache_key_properties(registry, req, global_items) -> None:
    reg = registry
    reg.set_global(global_items)
    mix = reg.resolve(req)
    source = req if req else global_items
    assert mix == {i: s for i, s in dict(source).items() if s != 0.0}
    key = reg.cache_key(mix)
    assert key == tuple(sorted(key)) and all(s != 0.0 for _, s in key)
    padded = {**dict.fromkeys(range(3), 0.0), **mix}
    assert reg.cache_key(padded) == key  # scale 0 == absent
    swapped = {{0: 1, 1: 0}.get(i, i): s for i, s in mix.items()}
    assert reg.cache_key(swapped) == key  # ids 0 and 1 hold the same content
    same = mix.get(0, 0.0) + mix.get(1, 0.0)
    assert (key == ()) == (same == 0.0 and mix.get(2, 0.0) == 0.0)


def test_mix_is_the_resolved_scales_and_their_cache_key(registry) -> None:
    """`AdapterRegistry.mix`, the one door to a request's mix: its scales are `resolve`'s,
    its key their `cache_key`; a name adds that adapter at scale 1 unless listed."""
    reg = registry
    reg.set_global([(2, 0.5)])
    assert reg.mix(None).scales == {2: 0.5} and reg.mix(None).cache_key == reg.cache_key({2: 0.5})
    assert reg.mix([(0, 0.0)]).cache_key == () and not reg.mix([(0, 0.0)]).scales
    name = reg.get(2).name
    named = [a for a in reg.list() if a.name == name][-1].id
    assert reg.mix([(0, 1.0)], adapter_name=name).scales == {0: 1.0, named: 1.0}
    assert reg.mix([(named, 0.25)], adapter_name=name).scales == {named: 0.25}
    assert reg.mix(None, adapter_name="no such adapter").scales == {2: 0.5}
    with pytest.raises(ValueError, match="id 9"):
        reg.mix([(9, 1.0)])
