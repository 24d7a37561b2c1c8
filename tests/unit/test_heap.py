"""`loraserve.heap`: ``trim`` gives freed heap pages back (RSS falls) where glibc's
``malloc_trim`` exists, and `HeapTrim` trims on falling idle after work and at most once
per period while working, never when off."""

from __future__ import annotations

import ctypes

import pytest

from loraserve import heap


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(heap._trim_fn() is None, reason="no glibc malloc_trim here")
def test_trim_returns_freed_heap_pages() -> None:
    """96 MiB in 64 KiB blocks (below the mmap threshold: from the heap), all freed but
    the last (it pins the heap's top, so nothing shrinks on its own): trim gives back
    most of it."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    heap.trim()
    blocks = [libc.malloc(64 * 1024) for _ in range(96 * 16)]
    for p in blocks:
        ctypes.memset(p, 1, 64 * 1024)  # touched: resident
    full = _rss_mib()
    for p in blocks[:-1]:
        libc.free(p)
    kept = _rss_mib()
    assert heap.trim()
    after = _rss_mib()
    libc.free(blocks[-1])
    assert kept > full - 32  # freeing alone kept the pages
    assert after < kept - 64


def test_heap_trim_moments(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(heap, "trim", lambda: calls.append(1) or True)
    now = [100.0]
    monkeypatch.setattr(heap.time, "monotonic", lambda: now[0])
    t = heap.HeapTrim(every_s=5.0)
    t.idle()
    assert calls == []  # idle without work: nothing to give back
    t.worked()
    now[0] += 4.0
    t.worked()
    assert calls == []  # work, within the period
    now[0] += 1.5
    t.worked()
    assert len(calls) == 1  # the period passed
    t.idle()
    assert len(calls) == 1  # no work since that trim
    t.worked()
    t.idle()
    assert len(calls) == 2  # falling idle after work
    t.idle()
    assert len(calls) == 2 and t.trims == 2
    off = heap.HeapTrim(every_s=0)
    off.worked()
    now[0] += 100
    off.worked()
    off.idle()
    assert len(calls) == 2


def test_period_from_env(monkeypatch) -> None:
    monkeypatch.setenv(heap.ENV, "0")
    assert heap.HeapTrim().every_s == 0
    monkeypatch.setenv(heap.ENV, "2.5")
    assert heap.every_s_from_env() == 2.5
    monkeypatch.setenv(heap.ENV, "junk")
    assert heap.every_s_from_env() == heap.EVERY_S


def test_after_growth_respects_the_switch(monkeypatch) -> None:
    """The KV pool's growth trims only while trimming is on: `LORASERVE_HEAP_TRIM_S=0`
    turns every trim off, that one included (it ran regardless before)."""
    calls: list[int] = []
    monkeypatch.setattr(heap, "trim", lambda: calls.append(1) or True)
    monkeypatch.setenv(heap.ENV, "0")
    assert not heap.after_growth() and calls == []
    monkeypatch.setenv(heap.ENV, "-1")
    assert not heap.after_growth() and calls == []
    monkeypatch.delenv(heap.ENV)
    assert heap.after_growth() and calls == [1]


def test_kv_pool_growth_trims_only_when_on(monkeypatch) -> None:
    """The runner's KV pool growth: a trim with the default period, none at 0."""
    from types import SimpleNamespace

    import torch

    from loraserve.engine import runner

    calls: list[int] = []  # glibc's malloc_trim itself, whoever calls it
    libc = SimpleNamespace(malloc_trim=lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(heap, "_trim_fn", lambda: libc)
    cfg = SimpleNamespace(n_layers=2, layer_kinds=["attn", "attn"], n_kv_heads=1, head_dim=4,
                          recurrent=False)  # fmt: skip
    monkeypatch.setenv(heap.ENV, "0")
    pool = runner.ModelRunner(SimpleNamespace(cfg=cfg), 4, torch.float32)  # type: ignore[arg-type]
    pool.ensure_capacity(2)
    pool.ensure_capacity(4)
    assert calls == [] and pool.capacity == 4
    monkeypatch.delenv(heap.ENV)
    pool.ensure_capacity(8)
    assert calls == [0]
