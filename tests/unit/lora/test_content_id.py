"""Content identity of adapters stored as float16: it hashes the halves as the file holds
them, so equal files share it and any changed half (one ulp) gives a new one; the same
values stored as float32 get an id of their own (their KV is kept apart, never mixed).
The oracle is the gguf package's writer and its float16 rounding (numpy)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from loraserve.lora.registry import AdapterRegistry
from tests.unit.lora.lora_util import gguf_adapter, pairs


def test_halves_identity(llama, tmp_path) -> None:
    _, model = llama
    t = {k: v.half().float() for k, v in pairs(3).items()}  # values float16 holds exactly
    f16 = {k: Q.F16 for k in t}
    reg = AdapterRegistry(model)
    a = reg.load(gguf_adapter(tmp_path / "a.gguf", "llama", t, types=f16))
    same = reg.load(gguf_adapter(tmp_path / "same.gguf", "llama", t, types=f16))
    assert all(w.a16 is not None for w in a.weights.values())  # read as halves
    key = "blk.1.ffn_up.weight.lora_b"
    bumped = dict(t)
    b = t[key].numpy().astype(np.float16)
    b.flat[-1] = np.nextafter(b.flat[-1], np.float16(np.inf))  # one ulp on one value
    bumped[key] = bumped[key].new_tensor(b.astype(np.float32))
    other = reg.load(gguf_adapter(tmp_path / "b.gguf", "llama", bumped, types=f16))
    wide = reg.load(gguf_adapter(tmp_path / "w.gguf", "llama", t))  # F32, the same values
    assert a.content_id == same.content_id
    assert len({a.content_id, other.content_id, wide.content_id}) == 3
    assert np.array_equal(wide.weights["blk.0.attn_v.weight"].a, a.weights["blk.0.attn_v.weight"].a)
