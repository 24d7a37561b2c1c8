"""bench.arch_tensors' dense layouts against llama.cpp's own test-llama-archs templates
(`tests/data/archs/<arch>.json`: every tensor the loader accepts for the arch)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.arch_shapes import DENSE_SHAPES
from bench.arch_tensors import tensor_specs
from bench.synth_archs import shape_of

ARCHS = Path(__file__).parent / "data" / "archs"
# fused q/k/v: the loader's create_tensor_qkv takes `attn_qkv` first; the templates write q/k/v
FUSED = {"attn_qkv.weight"}


def _template_names(arch: str) -> set[str]:
    v = json.loads((ARCHS / f"{arch}.json").read_text())["variants"]["dense"]
    names = {t[0] for t in v["tensors"]} | set(v.get("dropped_tensors") or [])
    return {re.sub(r"^blk\.\d+\.", "blk.N.", n) for n in names}


@pytest.mark.parametrize("arch", sorted(DENSE_SHAPES))
def test_dense_tensor_names_are_the_loaders(arch: str) -> None:
    known = _template_names(arch)
    ours = {re.sub(r"^blk\.\d+\.", "blk.N.", n) for n, _ in tensor_specs(shape_of(arch, 2))}
    extra = {n for n in ours - known if n.removeprefix("blk.N.") not in FUSED}
    assert not extra, f"{arch}: tensors llama.cpp's {arch} loader does not know: {extra}"
    # the required ones: every weight of layer 0 in the template, bar biases and options
    assert {"token_embd.weight", "output_norm.weight", "blk.N.attn_output.weight",
            "blk.N.ffn_down.weight"} <= ours  # fmt: skip


@pytest.mark.parametrize("arch", sorted(DENSE_SHAPES))
def test_dense_shapes_match_the_keys(arch: str) -> None:
    s = shape_of(arch, 1)
    k = s.keys
    spec = dict(tensor_specs(s))
    hd, nh, nkv = k["attention.key_length"], k["attention.head_count"], k["attention.head_count_kv"]
    qkv = spec.get("blk.0.attn_qkv.weight")
    if qkv is not None:
        assert qkv == ((nh + 2 * nkv) * hd, s.hidden)
    else:
        assert spec["blk.0.attn_q.weight"] == (nh * hd, s.hidden)
        assert spec["blk.0.attn_k.weight"] == spec["blk.0.attn_v.weight"] == (nkv * hd, s.hidden)
    assert spec["blk.0.attn_output.weight"] == (s.hidden, nh * hd)
    f = k["feed_forward_length"]
    assert spec["blk.0.ffn_down.weight"] == (s.hidden, f)
    up = spec["blk.0.ffn_up.weight"][0]
    assert up == (2 * f if "blk.0.ffn_gate.weight" not in spec and "ffn_fused" in s.flags else f)
    assert ("output.weight" in spec) == ("tied" not in s.flags)
