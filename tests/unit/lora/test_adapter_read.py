"""Reading an adapter: the tensors read as views of the file's mapping are copied before
they are held (a file rewritten in place after the load changes nothing held), a
non-finite value is refused naming its target whatever the storage type (the check runs
once over a run of tensors, then tensor by tensor to name it), and the content id is the
BLAKE3 hash of the values as stored (the halves of A and of B [out, r]), whatever the path
that computed it."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch
from blake3 import blake3
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file, save_file

from loraserve.lora.adapter import AdapterError
from loraserve.lora.read_gguf import runs_finite, tensors_finite
from loraserve.lora.registry import AdapterRegistry
from loraserve.model.gguf import GGUFFile
from tests.unit.lora.lora_util import gguf_adapter, pairs, peft_adapter, reference_content_id

V, UP = "blk.0.attn_v.weight", "blk.1.ffn_up.weight"
STORED = {"F32": None, "F16": Q.F16, "BF16": Q.BF16}


def _write(path, t, kind: str):
    qt = STORED[kind]
    return gguf_adapter(path, "llama", t, types={k: qt for k in t} if qt else None)


def _values(a) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {k: (w.a.numpy().copy(), w.b.numpy().copy()) for k, w in a.weights.items()}


@pytest.mark.parametrize("kind", sorted(STORED))
def test_held_tensors_are_not_the_file(llama, tmp_path, kind: str) -> None:
    """The file's bytes overwritten in place (same inode, as a mapping would show them)
    after the load: every held value stays what was read."""
    _, model = llama
    t = {k: v.half().float() for k, v in pairs(3).items()}  # exact in every type
    path = _write(tmp_path / "a.gguf", t, kind)
    reg = AdapterRegistry(model)
    a = reg.load(path)
    before = _values(a)
    with GGUFFile(path) as gg:
        start = min(i.offset for i in gg.tensors.values())
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mm[start:] = b"\xff" * (len(mm) - start)  # NaN in every type, over every tensor
    after = _values(a)
    assert before.keys() == after.keys()
    for k in before:
        assert np.array_equal(before[k][0], after[k][0]) and np.array_equal(
            before[k][1], after[k][1]
        ), k
    with pytest.raises(AdapterError, match="non-finite"):
        reg.read_path(path)  # the new bytes are read anew, and refused


@pytest.mark.parametrize("kind", sorted(STORED))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [V + ".lora_a", UP + ".lora_b"])
def test_non_finite_gguf_is_named(llama, tmp_path, kind: str, bad: float, where: str) -> None:
    _, model = llama
    t = pairs(1)
    t[where] = t[where].clone()
    t[where].view(-1)[-1] = bad
    reg = AdapterRegistry(model)
    with pytest.raises(AdapterError, match=f"{where.rpartition('.')[0]!r} holds non-finite"):
        reg.load(_write(tmp_path / "bad.gguf", t, kind))
    assert reg.list() == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_non_finite_peft_is_named(llama, tmp_path, dtype: torch.dtype) -> None:
    m, model = llama
    folder, _ = peft_adapter(tmp_path / "p", m, target_modules=["v_proj", "up_proj"])
    f = folder / "adapter_model.safetensors"
    sd = {k: v.to(dtype) for k, v in load_file(f).items()}
    key = next(k for k in sorted(sd) if "up_proj.lora_B" in k)
    sd[key] = sd[key].clone()
    sd[key].view(-1)[3] = float("nan")
    save_file(sd, f)
    reg = AdapterRegistry(model)
    target = f"blk.{key.split('layers.')[1].split('.')[0]}.ffn_up.weight"
    with pytest.raises(AdapterError, match=f"{target!r} holds non-finite"):
        reg.load(folder)
    sd[key].view(-1)[3] = 0.5
    save_file(sd, f)
    assert reg.load(folder).weights[target].b.dtype == torch.float32


def test_runs_finite_over_mixed_types(llama, tmp_path) -> None:
    """Runs of one type are checked together, the other types' tensors in their own
    runs; a non-finite value in any run is found, a finite file passes."""
    t = pairs(2)
    types = {V + ".lora_a": Q.F16, V + ".lora_b": Q.F16, UP + ".lora_a": Q.BF16}
    ok = gguf_adapter(tmp_path / "ok.gguf", "llama", t, types=types)
    with GGUFFile(ok) as gg:
        assert runs_finite(gg, list(gg.tensors.values()))
    for name in t:
        bad = dict(t)
        bad[name] = t[name].clone()
        bad[name].view(-1)[0] = float("inf")
        p = gguf_adapter(tmp_path / f"{name}.gguf", "llama", bad, types=types)
        with GGUFFile(p) as gg:
            assert not runs_finite(gg, list(gg.tensors.values())), name
            others = [i for n, i in gg.tensors.items() if n != name]
            assert runs_finite(gg, others), name


@pytest.mark.parametrize("kind", sorted(STORED))
def test_content_id_is_the_stored_values_hash(llama, tmp_path, kind: str) -> None:
    _, model = llama
    reg = AdapterRegistry(model)
    t = pairs(5, **{"blk.0.attn_q.weight": ((4, 64), (64, 4))})  # B unpermuted on read
    a = reg.load(_write(tmp_path / "a.gguf", t, kind))
    assert a.content_id == reference_content_id(a, blake3())


@pytest.mark.parametrize("kind", [*sorted(STORED), "PEFT-F16", "PEFT-F32"])
def test_held_bytes_are_the_counted_bytes(llama, tmp_path, kind: str) -> None:
    """The storages behind the held tensors hold exactly their bytes, no more (an empty
    tail slice of B once kept B's whole copy alive beside its tiles, half the adapter
    again in memory, uncounted; a view of the mapping kept the file mapped): a float32
    pair's tensors each their own, the float16 pairs' halves views of one arena, back to
    back."""
    m, model = llama
    if kind.startswith("PEFT"):
        path, _ = peft_adapter(tmp_path / "p", m, target_modules=["v_proj", "up_proj"])
        f = path / "adapter_model.safetensors"
        dtype = torch.float16 if kind.endswith("F16") else torch.float32
        save_file({k: v.to(dtype) for k, v in load_file(f).items()}, f)
    else:
        path = _write(tmp_path / "a.gguf", pairs(4), kind)
    a = AdapterRegistry(model).load(path)
    held = [t for w in a.weights.values() for t in w.tensors]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    assert held and sum(storages.values()) == sum(t.nbytes for t in held) == a.nbytes
    spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes) for t in held if t.nbytes)
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:], strict=False))  # no overlap


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_finite_from_bits_matches_torch(dtype: torch.dtype) -> None:
    """The bit test agrees with torch.isfinite on the edges: the largest finite values,
    subnormals, signed zeros, infinities and NaNs of either sign."""
    info = torch.finfo(dtype)
    edges = [0.0, -0.0, info.max, -info.max, info.tiny, info.tiny / 4, 1.0]
    bad = [float("inf"), float("-inf"), float("nan"), -float("nan")]
    for v in edges + bad:
        t = torch.tensor([0.5, v, -3.0], dtype=dtype)
        want = bool(torch.isfinite(t).all())
        assert tensors_finite([torch.ones(5, dtype=dtype), t]) == want, (dtype, v)
    assert tensors_finite([]) and not tensors_finite([torch.zeros(2, dtype=torch.float64)])
