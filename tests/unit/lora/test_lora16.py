"""Half-precision LoRA deltas (`kernels/lora16.c`) give `ls_lora`'s float32 bits exactly,
and an adapter stored as float16 gives the same logits whatever else shares its batch."""

from __future__ import annotations

import pytest
import torch

from loraserve.kernels import lora16
from loraserve.kernels.floatmm import backend, lora_delta
from tests.unit.lora.lora_util import f16_adapter
from tests.unit.model.quant_util import quantized_model

needs_c = pytest.mark.skipif(
    backend() != "c" or not lora16.available(), reason="no C compiler here"
)


def _halves(g: torch.Generator, r: int, k: int, n: int) -> tuple[torch.Tensor, ...]:
    """Random A [r, k], B [n, r] whose values are float16 (so both routes see the same)."""
    a = (torch.randn(r, k, generator=g) * 0.3).half().float()
    b = (torch.randn(n, r, generator=g) * 0.3).half().float()
    return a, b


@needs_c
@pytest.mark.parametrize(("k", "n"), [(72, 203), (64, 256), (13, 9)])
def test_half_route_equals_float32_route_bitwise(k: int, n: int) -> None:
    """Ranks around the 4- and 8-wide blocks (3, 8, 16, 21), input and output widths with
    and without tails, rows of different mixes (a 0 scale: the adapter is not in the row's
    mix), y a column slice of a wider tensor: every bit as ls_lora's."""
    g = torch.Generator().manual_seed(k * n)
    t = 7
    pairs = [_halves(g, r, k, n) for r in (3, 8, 16, 21)]
    x = torch.randn(t, k, generator=g)
    s = torch.randn(len(pairs), t, generator=g)
    s[0, 1] = s[2, 3] = s[1, 5] = 0.0
    s[:, 6] = 0.0  # a row in no mix: left as it was
    wide = torch.randn(t, n + 10, generator=g)
    ref = wide.clone()
    lora_delta(x, ref[:, 5 : 5 + n], [(a, b) for a, b in pairs], s)
    got = wide.clone()
    halves = [(a.half(), lora16.tiles(b), lora16.tail(b)) for a, b in pairs]
    for _a, b in pairs:  # the halves held are B's own values: tiles and tail give B back
        assert torch.equal(lora16.untile(lora16.tiles(b), lora16.tail(b)).float(), b)
    lora16.lora_delta16(x, got[:, 5 : 5 + n], halves, s)
    assert torch.equal(got, ref)
    assert torch.equal(got[6], wide[6]) and not torch.equal(got[0], wide[0])
    for row in range(t):  # a row alone: the same bits as in the batch
        alone = wide[row : row + 1].clone()
        lora16.lora_delta16(x[row : row + 1], alone[:, 5 : 5 + n], halves, s[:, row : row + 1])
        assert torch.equal(alone[0], got[row])


def _both_routes(
    x: torch.Tensor, y0: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor]],
    s: torch.Tensor, threads: int, rows_alone: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:  # fmt: skip
    """y0 [T, N] plus the deltas of x [T, K] under the scales s [adapters, T]: by `ls_lora`'s
    float32 route, by the half route on ``threads`` threads, and (``rows_alone``) by the half
    route one row at a time ([1, N] each)."""
    ref = y0.clone()
    lora_delta(x, ref, [(a, b) for a, b in pairs], s)
    halves = [(a.half(), lora16.tiles(b), lora16.tail(b)) for a, b in pairs]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = y0.clone()
        lora16.lora_delta16(x, got, halves, s)
        alone = [y0[r : r + 1].clone() for r in range(len(x))] if rows_alone else []
        for r, row in enumerate(alone):
            lora16.lora_delta16(x[r : r + 1], row, halves, s[:, r : r + 1])
    finally:
        torch.set_num_threads(before)
    return ref, got, alone


@needs_c
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("t", [1, 2, 8, 16, 21])
def test_rows_grouped_by_adapter_keep_each_rows_bits(threads: int, t: int) -> None:
    """The kernel groups a step's rows by adapter (up to 4 rows share each widened A
    vector) and splits rows or columns over threads: for any number of rows sharing an
    adapter (1 to 9 here, and adapters no row uses), ranks 8, 16 and 5, and 1 to 3
    threads, each row's delta is ls_lora's float32 bits, and the row alone gives them."""
    g = torch.Generator().manual_seed(t * 10 + threads)
    k, n = 300, 1204  # an output tail of 4; 2 rows are work enough for threads
    pairs = [_halves(g, r, k, n) for r in (8, 16, 5, 8, 16)]
    x = torch.randn(t, k, generator=g)
    owner = torch.randint(0, 3, (t,), generator=g)  # most rows on adapters 0-2, some on more
    s = torch.zeros(len(pairs), t)
    for row in range(t):
        s[owner[row], row] = 0.5 + row / 8
        if row % 5 == 3:
            s[4, row] = -1.25  # a second adapter in the row's mix
    y0 = torch.randn(t, n, generator=g)
    ref, got, alone = _both_routes(x, y0, pairs, s, threads, rows_alone=True)
    assert torch.equal(got, ref)
    for r in range(t):
        assert torch.equal(alone[r][0], got[r])


@needs_c
@pytest.mark.parametrize("threads", [2, 3])
def test_uneven_shares_keep_each_rows_bits(threads: int) -> None:
    """The threads' shares of shrinks and rows follow their weights (ranks 64 beside rank
    1, rows with no adapter at all, a heavy row last): each row still gets ls_lora's
    float32 bits, once (a row or item in two shares, or in none, changes them)."""
    g = torch.Generator().manual_seed(threads)
    k, n = 96, 260
    pairs = [_halves(g, r, k, n) for r in (64, 1, 16)]
    t = 11
    x = torch.randn(t, k, generator=g)
    s = torch.zeros(len(pairs), t)
    for row, a in enumerate([1, 1, None, 1, 0, None, 1, 2, 1, None, 0]):
        if a is not None:
            s[a, row] = 0.75 - row / 16
    s[2, t - 1] = 2.0  # the last row on two adapters
    y0 = torch.randn(t, n, generator=g)
    ref, got, _ = _both_routes(x, y0, pairs, s, threads)
    assert torch.equal(got, ref)


@needs_c
def test_half_route_refuses_shapes_that_do_not_fit() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = _halves(g, 4, 16, 8)
    x, y = torch.randn(2, 16), torch.zeros(2, 8)
    with pytest.raises(ValueError, match="do not fit"):
        lora16.lora_delta16(x, y, [(a.half(), b.t().half(), lora16.tail(b))], torch.ones(1, 2))
    with pytest.raises(ValueError, match="do not fit"):  # B as float32: no halves
        lora16.lora_delta16(x, y, [(a.half(), lora16.tiles(b), b[:0])], torch.ones(1, 2))
    with pytest.raises(ValueError, match="scales"):
        lora16.lora_delta16(x, y, [(a.half(), lora16.tiles(b), lora16.tail(b))], torch.ones(2, 2))


@needs_c
def test_half_adapters_give_their_float32_twins_bits_in_mixed_batches(tmp_path) -> None:
    """Adapters of ranks 3, 8 and 16 stored as F16 (read through their halves by the fused
    layers) and their F32 twins (the float32 route): every sequence's logits are bitwise
    equal between the two, in a batch of mixed mixes and ranks and alone, prefill and
    decode, and equal the per-layer Python path's."""
    from loraserve.engine.runner import BatchItem, ModelRunner
    from loraserve.lora.adapter import LoraWeight
    from loraserve.lora.registry import AdapterRegistry

    model = quantized_model(tmp_path, "gemma3")
    reg = AdapterRegistry(model)
    for halves in (True, False):  # ids 0-2 halves, 3-5 their float32 twins
        for i, rank in enumerate((3, 8, 16)):
            path = tmp_path / f"a{i}-{halves}.gguf"
            f16_adapter(path, reg.shapes, i, rank, halves, skip="attn_k" if i == 1 else "")
            a = reg.load(path)
            if not halves:  # equal content shares the halves' weights: the float32 alone
                a.weights = {t: LoraWeight(w.a, w.b, w.factor) for t, w in a.weights.items()}
    w0 = reg.get(0).weights
    assert all(w.a16 is not None for w in w0.values())  # the half route is taken
    assert all(w.a16 is None for w in reg.get(3).weights.values())
    g = torch.Generator().manual_seed(7)
    ids = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (9, 6, 7, 5, 8)]
    # the last mix holds a half adapter and a float32 one (4, the twin of 1): one step reads
    # both kinds, a kernel call per kind, in id order as the all-float32 twin mix is
    mixes = [{0: 1.0}, {1: 0.5, 2: -1.5}, {}, {2: 1.0, 0: -0.25}, {0: 0.75, 4: -1.0}]

    def run(seqs: list[int], twin: bool, fused: bool = True) -> list[torch.Tensor]:
        model.decoder.use_fused = fused
        try:
            runner = ModelRunner(model.decoder, 4, torch.float32, lora=reg.build_delta)
            runner.ensure_capacity(20)
            items = []
            for j in seqs:
                mix = {i + 3 * (twin and i < 3): s for i, s in mixes[j].items()}
                items.append((ids[j], [4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3], mix))
            out = [runner.forward([BatchItem(t, 0, len(t), b, True, m) for t, b, m in items])]
            for p in range(2):
                step = [BatchItem(t + [7, 8], len(t) + p, 1, b, True, m) for t, b, m in items]
                out.append(runner.forward(step))
            return out
        finally:
            model.decoder.use_fused = True

    together = run([0, 1, 2, 3, 4], twin=False)
    for a, b in zip(together, run([0, 1, 2, 3, 4], twin=True), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(together, run([0, 1, 2, 3, 4], twin=False, fused=False), strict=True):
        assert torch.equal(a, b)
    for j in range(5):  # alone: the same bits as in the batch
        for step, alone in enumerate(run([j], twin=False)):
            assert torch.equal(alone[0], together[step][j])
    assert not torch.equal(together[0][0], together[0][2])  # the adapters change the logits


@needs_c
def test_hold_copies_the_halves_of_clone_tiles_and_tail() -> None:
    """`lora16.hold` (one C pass for a whole adapter) gives the very halves of
    ``(a.clone(), tiles(b), tail(b))`` for ranks below, at and past the 8 x 8 transposes
    and outputs with and without a tail, and says whether every value was finite: an
    infinity or a NaN anywhere (A, a whole tile, the tail) is seen; the largest finite
    halves are not one. The halves are views of one arena, back to back in order."""
    g = torch.Generator().manual_seed(7)
    pairs = [
        ((torch.randn(r, k, generator=g) * 9).half(), (torch.randn(n, r, generator=g) * 9).half())
        for r in (1, 3, 8, 9, 16, 17, 24)
        for k, n in ((640, 1024), (13, 9), (5, 7), (16, 8))
    ]
    held, finite, arena = lora16.hold(pairs)
    assert finite
    assert arena.numel() == sum(a.numel() + b.numel() for a, b in pairs)  # views, back to back
    assert torch.equal(
        arena.view(torch.int16),
        torch.cat([t.reshape(-1) for h in held for t in h]).view(torch.int16),
    )
    for (a, b), (a16, bt, rest) in zip(pairs, held, strict=True):
        for got, want in ((a16, a), (bt, lora16.tiles(b)), (rest, lora16.tail(b))):
            assert got.dtype == torch.float16 and got.shape == want.shape
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        assert a16.data_ptr() != a.data_ptr()  # a copy of its own
    edge = (torch.full((8, 16), 65504.0).half(), torch.full((12, 8), -65504.0).half())
    assert lora16.hold([edge])[1]
    for bad in (float("inf"), float("-inf"), float("nan")):
        for where in ("a", "tile", "tail"):
            a, b = torch.randn(8, 16, generator=g).half(), torch.randn(12, 8, generator=g).half()
            {"a": a[3], "tile": b[6], "tail": b[10]}[where][2] = bad
            assert not lora16.hold([(a, b)])[1], (bad, where)
