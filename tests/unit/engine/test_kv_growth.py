"""The KV pool grows layer by layer: every layer keeps its contents bitwise, the new
blocks are zeros, and each old layer's tensors are released as its new ones are made
(the growth never holds both sizes of every layer at once)."""

from __future__ import annotations

import gc
import weakref

import torch

from loraserve.engine.runner import ModelRunner


def test_growth_keeps_contents_and_releases_each_old_layer(llama) -> None:
    _, model = llama
    runner = ModelRunner(model.decoder, 4, torch.float32)
    runner.ensure_capacity(3)
    g = torch.Generator().manual_seed(0)
    for k, v in runner.kv:
        k.copy_(torch.randn(k.shape, generator=g))
        v.copy_(torch.randn(v.shape, generator=g))
    before = [(k.clone(), v.clone()) for k, v in runner.kv]
    olds = [weakref.ref(t) for pair in runner.kv for t in pair]
    alive: list[int] = []
    real_zeros = torch.zeros

    def zeros(*args, **kw):  # counts the old layers still alive as each new one is made
        gc.collect()
        alive.append(sum(r() is not None for r in olds))
        return real_zeros(*args, **kw)

    torch.zeros = zeros  # type: ignore[assignment]
    try:
        runner.ensure_capacity(7)
    finally:
        torch.zeros = real_zeros  # type: ignore[assignment]
    n_layers = len(before)
    assert runner.capacity == 7 and len(runner.kv) == n_layers
    for (k, v), (k0, v0) in zip(runner.kv, before, strict=True):
        assert k.shape[0] == v.shape[0] == 7 * runner.bs
        assert torch.equal(k[: k0.shape[0]], k0) and torch.equal(v[: v0.shape[0]], v0)
        assert not k[k0.shape[0] :].any() and not v[v0.shape[0] :].any()
    # as layer i's new K is made, layers 0..i-1 have released their old K and V
    assert alive == [2 * (n_layers - i) for i in range(n_layers)]
    gc.collect()
    assert all(r() is None for r in olds)
