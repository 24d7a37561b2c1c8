"""The decode steps' state-record pool (`model.recurrent.records`): a record's memory is handed
out again only when no tensor, view or storage refers to it, never while a live state, a
snapshot or anything else still holds it; the pool keeps a bounded number of storages."""

from __future__ import annotations

import gc

import pytest
import torch

from loraserve.model.recurrent import records
from loraserve.model.recurrent.records import RecordPool

needs_count = pytest.mark.skipif(records._use_count is None, reason="no storage use count")


@needs_count
def test_free_records_memory_is_reused() -> None:
    pool = RecordPool()
    a, b = pool.take("k", 100, 2)
    assert a.shape == b.shape == (100,) and a.dtype == torch.float32 and a.is_contiguous()
    ptrs = {a.data_ptr(), b.data_ptr()}
    del a, b
    gc.collect()
    others = [torch.empty(100), torch.empty(100)]  # the heap's freed chunks would go here
    c, d = pool.take("k", 100, 2)
    assert {c.data_ptr(), d.data_ptr()} == ptrs
    assert not ptrs & {t.data_ptr() for t in others}
    c.fill_(1.0)  # a reused record is a full, writable record
    assert c.sum().item() == 100.0


@needs_count
def test_held_records_are_never_handed_out() -> None:
    """A record still referred to, by its own tensor, a view of it, a storage object of it
    or a dict (a snapshot), keeps its memory to itself."""
    pool = RecordPool(slack=8)
    recs = pool.take("k", 64, 4)
    recs[0].fill_(7.0)
    keep = [recs[0], recs[1].view(8, 8), recs[2].untyped_storage(), {3: recs[3]}]
    held = {r.data_ptr() for r in recs}
    del recs
    gc.collect()
    for _ in range(3):
        new = pool.take("k", 64, 4)
        assert not held & {r.data_ptr() for r in new}
        for r in new:
            r.fill_(-1.0)
        del new
    assert torch.equal(keep[0], torch.full((64,), 7.0))
    del keep[1]
    gc.collect()
    assert len({r.data_ptr() for r in pool.take("k", 64, 8)} & held) == 1  # the view's went


@needs_count
def test_keys_and_sizes_do_not_mix() -> None:
    pool = RecordPool()
    (a,) = pool.take("a", 32, 1)
    pa = a.data_ptr()
    del a
    gc.collect()
    (b,) = pool.take("b", 32, 1)
    (c,) = pool.take("a", 16, 1)  # another size under the same key: a new record
    assert b.data_ptr() != pa and c.numel() == 16 and c.data_ptr() != pa


def test_the_pool_keeps_a_bounded_number() -> None:
    pool = RecordPool(slack=4)
    held = [pool.take("k", 8, 3) for _ in range(10)]  # every record still held
    assert pool.held("k", 8) == 12
    del held
    pool.take("k", 8, 1)
    assert pool.held("k", 8) == 4
