"""The batch-invariant attention kernel (loraserve/kernels/attention.c) and its fallback.

Both must equal softmax attention computed in float64, and give bit-identical results for a
query row alone, inside any batch, in any prefill chunking or as a one-token decode step.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraserve.kernels.attention import attention, attention_c, backend
from tests.unit.model.attention_util import IMPLS, Impl, attend

S = 256  # pool slots


def pool(hkv: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random KV pool: k, v [S, Hkv, D] float32."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(S, hkv, d, generator=g), torch.randn(S, hkv, d, generator=g)


def seq_slots(n_seqs: int, length: int, seed: int = 1) -> list[torch.Tensor]:
    """Disjoint, scattered slot lists (positions 0..length-1) for n_seqs sequences."""
    perm = torch.randperm(S, generator=torch.Generator().manual_seed(seed))
    return [perm[i * length : (i + 1) * length] for i in range(n_seqs)]


def reference(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    slots: torch.Tensor,
    pos: int,
    window: int,
    scale: float,
) -> torch.Tensor:
    """Float64 softmax attention of one query row q [H, D] at ``pos`` -> [H, D]."""
    lo = pos + 1 - window if 0 < window <= pos else 0
    keys = slots[lo : pos + 1]
    group = q.shape[0] // kv[0].shape[1]
    k = kv[0][keys].double().repeat_interleave(group, 1)  # [m, H, D]
    v = kv[1][keys].double().repeat_interleave(group, 1)
    p = torch.softmax(torch.einsum("hd,mhd->hm", q.double(), k) * scale, dim=-1)  # [H, m]
    return torch.einsum("hm,mhd->hd", p, v)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("h", "hkv", "d", "window"),
    [
        (4, 1, 256, 0),
        (4, 2, 44, 0),
        (2, 2, 64, 7),
        (4, 1, 256, 5),
        (3, 1, 3, 0),
        (6, 3, 136, 9),
        (40, 2, 24, 0),
    ],
)
def test_matches_float64_reference(impl: Impl, h: int, hkv: int, d: int, window: int) -> None:
    """Every row equals float64 attention (GQA, head dims with every tail, windows)."""
    kv, slots = pool(hkv, d), seq_slots(3, 40)
    items = [(0, 0, 23), (1, 31, 1), (2, 12, 9)]
    q = torch.randn(33, h, d, generator=torch.Generator().manual_seed(5))
    got = attend(impl, q, kv, slots, items, window, scale=d**-0.5)
    r = 0
    for s, start, n in items:
        for p in range(start, start + n):
            want = reference(q[r], kv, slots[s], p, window, d**-0.5)
            assert (got[r].double() - want).abs().max() <= 1e-5 * want.abs().max(), (s, p)
            r += 1


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window", [0, 6])
def test_row_alone_equals_row_in_batch(impl: Impl, window: int) -> None:
    """A decode row gives the same bits alone and among other sequences of other lengths."""
    kv, slots = pool(1, 256), seq_slots(4, 60)
    q = torch.randn(1 + 1 + 17 + 1, 4, 256, generator=torch.Generator().manual_seed(2))
    batch = attend(impl, q, kv, slots, [(1, 40, 1), (0, 10, 1), (2, 0, 17), (3, 59, 1)], window)
    for r, (s, start) in {0: (1, 40), 1: (0, 10), 19: (3, 59)}.items():
        alone = attend(impl, q[r : r + 1], kv, slots, [(s, start, 1)], window)
        assert torch.equal(alone[0], batch[r])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window", [0, 5])
def test_chunking_and_decode_bitwise_equal(impl: Impl, window: int) -> None:
    """One prefill chunk, several chunks and one token at a time give the same bits."""
    kv, slots = pool(2, 64), seq_slots(1, 30)
    q = torch.randn(30, 4, 64, generator=torch.Generator().manual_seed(3))
    whole = attend(impl, q, kv, slots, [(0, 0, 30)], window)
    for cuts in ([0, 7, 8, 20, 30], [0, 1, 2, 29, 30], list(range(31))):
        got = torch.cat([attend(impl, q[a:b], kv, slots, [(0, a, b - a)], window)
                         for a, b in zip(cuts, cuts[1:], strict=False)])  # fmt: skip
        assert torch.equal(got, whole), cuts


def test_c_equals_itself_under_threads_and_strides() -> None:
    """The kernel's bits do not depend on the thread count or on q's row stride."""
    if backend() != "c":
        pytest.skip("no C kernel")
    kv, slots = pool(1, 256), seq_slots(2, 90)
    qk = torch.randn(50, 5, 256, generator=torch.Generator().manual_seed(4))  # q | k heads
    q = qk[:, :4]  # [T, 4, D] non-contiguous, as the decoder passes it
    items = [(0, 40, 10), (1, 0, 40)]
    base = attend(attention_c, q.contiguous(), kv, slots, items)
    assert torch.equal(attend(attention_c, q, kv, slots, items), base)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(attend(attention_c, q, kv, slots, items), base)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(attend(attention, q, kv, slots, items), base)


@pytest.mark.parametrize("impl", IMPLS)
def test_non_finite_inputs_give_non_finite_rows(impl: Impl) -> None:
    """A NaN key, an infinite value or query: non-finite output for the rows that see them,
    the other rows untouched; never a crash."""
    k, v = pool(1, 32)
    slots = seq_slots(2, 10)
    k[slots[0][3], 0, 5] = float("nan")
    v[slots[1][2], 0, 0] = float("inf")
    q = torch.randn(20, 2, 32, generator=torch.Generator().manual_seed(6))
    q[19, 1, 0] = float("inf")
    out = attend(impl, q, (k, v), slots, [(0, 0, 10), (1, 0, 10)])
    finite = out.isfinite().all(-1).all(-1)  # [T] row fully finite
    assert finite[:3].all() and not finite[3:10].any()  # keys 0..2 are clean, 3 is NaN
    assert finite[10:12].all() and not finite[12:20].any()  # the inf value from key 2 on
    assert not out[19, 1].isfinite().all()


@pytest.mark.parametrize("impl", IMPLS)
def test_inconsistent_metadata_raises(impl: Impl) -> None:
    """A key count past its sequence's slots or a slot outside the pool: ValueError."""
    kv, q = pool(1, 16), torch.randn(1, 1, 16)
    i32, i64 = torch.int32, torch.long
    off, seq = torch.tensor([0, 4], dtype=i64), torch.zeros(1, dtype=i32)
    with pytest.raises(ValueError):
        impl(q, *kv, torch.arange(4), off, seq, torch.tensor([5], dtype=i32), 1.0)
    with pytest.raises(ValueError):
        impl(q, *kv, torch.tensor([0, 1, 2, S]), off, seq, torch.tensor([2], dtype=i32), 1.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_rows_of_one_sequence_in_any_order(impl: Impl) -> None:
    """Rows of one sequence at scattered positions, in any order, equal each row alone."""
    kv, slots = pool(1, 64), seq_slots(1, 50)
    pos = [5, 40, 6, 0, 39, 49, 17]
    q = torch.randn(len(pos), 4, 64, generator=torch.Generator().manual_seed(8))
    i32 = torch.int32
    nkeys = torch.tensor([p + 1 for p in pos], dtype=i32)
    off, seq = torch.tensor([0, 50]), torch.zeros(len(pos), dtype=i32)
    out = impl(q, *kv, slots[0], off, seq, nkeys, 0.125, 4)
    for r, p in enumerate(pos):
        assert torch.equal(attend(impl, q[r : r + 1], kv, slots, [(0, p, 1)], 4)[0], out[r])


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[tuple[int, int, int]], int, tuple[int, int], int]:
    """A batch of items (sequence, start, n) over 4 sequences of 48 positions (a sequence
    may appear twice), a window, (H, Hkv) and a thread count."""
    items = []
    for s in draw(st.lists(st.integers(0, 3), min_size=1, max_size=5)):
        start = draw(st.integers(0, 47))
        items.append((s, start, draw(st.integers(1, 48 - start))))
    heads = draw(st.sampled_from([(4, 1), (2, 2), (8, 2), (20, 1)]))
    return items, draw(st.sampled_from([0, 1, 4, 16])), heads, draw(st.integers(1, 2))


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches())
def test_any_batch_equals_rows_alone(impl: Impl, batch: tuple) -> None:
    """Property: every row of a random batch (decode rows and chunks mixed, over sequences
    of other lengths, any head layout and thread count) equals that row attended alone as a
    one-token decode step."""
    items, window, (h, hkv), threads = batch
    kv, slots = pool(hkv, 40), seq_slots(4, 48)
    t = sum(n for _, _, n in items)
    q = torch.randn(t, h, 40, generator=torch.Generator().manual_seed(7))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = attend(impl, q, kv, slots, items, window)
    finally:
        torch.set_num_threads(before)
    r = 0
    for s, start, n in items:
        for p in range(start, start + n):
            assert torch.equal(
                attend(impl, q[r : r + 1], kv, slots, [(s, p, 1)], window)[0], out[r]
            )
            r += 1
