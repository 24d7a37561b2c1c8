"""The attention kernel's options (loraserve/kernels/attention.c and its fallback): logit
soft-capping (gemma2), attention sinks (gpt-oss) and values narrower than the keys, read as a
view of the key pool (latent attention, deepseek2). Each must equal float64 softmax attention
with that option, and keep the kernel's promise: a row's bits are the same alone, in any batch,
in any chunking.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.model.attention_util import IMPLS, Impl, attend

S = 128  # pool slots


def pools(hkv: int, d: int, dv: int, latent: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """k [S, Hkv, D] and v [S, Hkv, Dv]: v a view of k's first Dv columns when ``latent``."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(S, hkv, d, generator=g) * 2
    if latent:
        return k, k[:, :, :dv]
    return k, torch.randn(S, hkv, dv, generator=g)


def reference(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    keys: torch.Tensor,
    scale: float,
    softcap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Float64 attention of one query row q [H, D] over the slots ``keys`` -> [H, Dv]."""
    group = q.shape[0] // kv[0].shape[1]
    k = kv[0][keys].double().repeat_interleave(group, 1)  # [m, H, D]
    v = kv[1][keys].double().repeat_interleave(group, 1)  # [m, H, Dv]
    s = torch.einsum("hd,mhd->hm", q.double(), k) * scale  # [H, m]
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if sinks is not None:
        s = torch.cat((s, sinks.double().unsqueeze(1)), dim=1)  # [H, m + 1]
    p = torch.softmax(s, dim=-1)[:, : k.shape[0]]
    return torch.einsum("hm,mhd->hd", p, v)


CASES = [  # h, hkv, d, dv, latent, window, softcap, with sinks
    (4, 2, 64, 64, False, 0, 5.0, False),
    (4, 1, 40, 40, False, 6, 0.0, True),
    (6, 3, 24, 24, False, 0, 2.0, True),
    (8, 1, 72, 64, True, 0, 0.0, False),  # latent: D = Dv + rope part
    (3, 1, 13, 8, True, 5, 3.0, True),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("h", "hkv", "d", "dv", "latent", "window", "cap", "sink"), CASES)
def test_options_match_float64_reference(
    impl: Impl, h: int, hkv: int, d: int, dv: int, latent: bool, window: int, cap: float, sink: bool
) -> None:
    """Soft-capping, sinks and narrow (aliased) values each equal float64 attention."""
    kv = pools(hkv, d, dv, latent)
    slots = [torch.randperm(S, generator=torch.Generator().manual_seed(i))[:40] for i in range(2)]
    sinks = torch.randn(h, generator=torch.Generator().manual_seed(3)) * 3 if sink else None
    items = [(0, 0, 21), (1, 30, 2)]
    q = torch.randn(23, h, d, generator=torch.Generator().manual_seed(5))
    got = attend(impl, q, kv, slots, items, window, d**-0.5, cap, sinks)
    assert got.shape == (23, h, dv)
    r = 0
    for s, start, n in items:
        for p in range(start, start + n):
            lo = p + 1 - window if 0 < window <= p else 0
            want = reference(q[r], kv, slots[s][lo : p + 1], d**-0.5, cap, sinks)
            assert (got[r].double() - want).abs().max() <= 2e-6 * want.abs().max() + 1e-7
            r += 1


@pytest.mark.parametrize("impl", IMPLS)
def test_sinks_only_rescale_and_capping_saturates(impl: Impl) -> None:
    """A sink adds no value: the output is the plain output times 1 - (sink's weight); a
    score far past the cap is held at the cap (tanh saturates, never NaN)."""
    kv = pools(1, 16, 16, False)
    slots = [torch.arange(S)]
    q = torch.randn(10, 2, 16, generator=torch.Generator().manual_seed(1))
    plain = attend(impl, q, kv, slots, [(0, 0, 10)], scale=0.2)
    sinks = torch.tensor([-1e4, 0.5])
    sunk = attend(impl, q, kv, slots, [(0, 0, 10)], scale=0.2, sinks=sinks)
    assert torch.allclose(sunk[:, 0], plain[:, 0], atol=1e-6)  # a -1e4 sink weighs nothing
    assert (sunk[:, 1].norm(dim=-1) < plain[:, 1].norm(dim=-1)).all()
    huge = attend(impl, q * 1e6, kv, slots, [(0, 0, 10)], scale=0.2, softcap=1.0)
    assert huge.isfinite().all()


Layout = tuple[int, int, int, int, bool]
LAYOUTS: Sequence[Layout] = [(4, 2, 32, 32, False), (8, 1, 40, 32, True), (2, 1, 24, 24, False)]


@st.composite
def batches(draw: st.DrawFn) -> tuple:
    """Items (sequence, start, n) over 3 sequences of 40 positions, a window, a layout, a
    soft cap, sinks or not, and a thread count."""
    items = []
    for s in draw(st.lists(st.integers(0, 2), min_size=1, max_size=4)):
        start = draw(st.integers(0, 39))
        items.append((s, start, draw(st.integers(1, 40 - start))))
    window, layout = draw(st.sampled_from([0, 3, 16])), draw(st.sampled_from(LAYOUTS))
    cap, sink = draw(st.sampled_from([0.0, 4.0])), draw(st.booleans())
    return items, window, layout, cap, sink, draw(st.integers(1, 2))


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches())
def test_any_batch_equals_rows_alone_with_options(impl: Impl, batch: tuple) -> None:
    """Property: with soft-capping, sinks and latent-style values, every row of a random
    batch equals that row attended alone as a one-token decode step, bit for bit."""
    items, window, (h, hkv, d, dv, latent), cap, sink, threads = batch
    kv = pools(hkv, d, dv, latent)
    slots = [torch.randperm(S, generator=torch.Generator().manual_seed(i))[:40] for i in range(3)]
    sinks = torch.randn(h, generator=torch.Generator().manual_seed(2)) if sink else None
    q = torch.randn(sum(n for _, _, n in items), h, d, generator=torch.Generator().manual_seed(7))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = attend(impl, q, kv, slots, items, window, 0.3, cap, sinks)
    finally:
        torch.set_num_threads(before)
    r = 0
    for s, start, n in items:
        for p in range(start, start + n):
            alone = attend(impl, q[r : r + 1], kv, slots, [(s, p, 1)], window, 0.3, cap, sinks)
            assert torch.equal(alone[0], out[r])
            r += 1
