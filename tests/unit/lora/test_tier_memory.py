"""Evicted adapters free their memory: the fused layers' per-adapter arrays (which hold the
adapter's tensors) are dropped once the adapter leaves memory, and the tiers' byte count
is each resident adapter's tensors: an F16 adapter's halves alone (no float32 copy)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from loraserve.kernels.floatmm import backend
from loraserve.lora.registry import AdapterRegistry
from tests.unit.lora.lora_util import f16_adapter

needs_c = pytest.mark.skipif(backend() != "c", reason="no C compiler here")


@needs_c
def test_evicted_adapters_leave_the_fused_layers_cache(tmp_path) -> None:
    from loraserve.engine.runner import BatchItem, ModelRunner
    from tests.unit.model.quant_util import quantized_model

    model = quantized_model(tmp_path, "gemma3")
    fused = model.decoder._fused()
    assert fused is not None
    reg = AdapterRegistry(model)
    for i in range(12):
        f16_adapter(tmp_path / f"a{i}.gguf", reg.shapes, i, 4, halves=i % 2 == 0)
        reg.load(tmp_path / f"a{i}.gguf")
    a0 = reg.get(0)
    want = sum(t.nbytes for w in a0.weights.values() for t in w.tensors)
    assert a0.nbytes == want
    # the F16 adapter is held as its halves alone: 2 bytes a value (A [r, in] and B
    # [out, r] of every target), half its F32 twin's 4 (the same shapes and rank)
    values = sum(w.rank * (inp + out) for w, (out, inp) in
                 ((w, reg.shapes[t]) for t, w in a0.weights.items()))  # fmt: skip
    assert a0.nbytes == 2 * values
    assert all(w.halves_only for w in a0.weights.values())
    assert reg.get(1).nbytes == 4 * values
    runner = ModelRunner(model.decoder, 4, torch.float32, lora=reg.build_delta)
    runner.ensure_capacity(4)
    ids = [5, 9, 17, 33]

    def step(adapter_id: int) -> None:
        runner.forward([BatchItem(ids, 0, len(ids), [0], True, {adapter_id: 1.0})])

    for i in range(12):
        step(i)
    assert fused.cached_adapters == 12
    for i in range(2, 12):
        reg.evict(i)
    assert reg.resident_bytes == reg.get(0).nbytes + reg.get(1).nbytes
    step(0)
    assert fused.cached_adapters <= 2  # the 10 evicted ones' arrays (and tensors) are gone


@needs_c
def test_evicted_adapters_tensors_are_freed(tmp_path) -> None:
    """Once evicted, an adapter's tensors are garbage (no reference left anywhere), even
    after its byte count was taken: the count never keeps the weights it counted."""
    from tests.unit.model.quant_util import quantized_model

    model = quantized_model(tmp_path, "gemma3")
    reg = AdapterRegistry(model)
    for i in range(2):
        f16_adapter(tmp_path / f"a{i}.gguf", reg.shapes, i, 4, halves=i == 0)
        reg.load(tmp_path / f"a{i}.gguf")
    refs = [weakref.ref(t) for i in range(2) for w in reg.get(i).weights.values()
            for t in w.tensors]  # fmt: skip
    assert reg.resident_bytes == reg.get(0).nbytes + reg.get(1).nbytes > 0
    reg.evict(0)
    reg.evict(1)
    gc.collect()
    assert refs and all(r() is None for r in refs)
    assert reg.resident_bytes == 0 and reg.get(0).nbytes == 0
    reg.install(0, reg.read(0))  # read again: counted again
    assert reg.get(0).nbytes == 2 * sum(w.rank * sum(reg.shapes[t])
                                        for t, w in reg.get(0).weights.items())  # fmt: skip
