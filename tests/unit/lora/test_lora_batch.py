"""`LoraBatch` on its own: each row of a step gets the sum over its own mix of
scale x factor x B A x, for plain targets, one expert's rows and the output's logits rows; rows
outside every span stay bit-equal (tensors built in the test, the sum written out by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraserve.lora.adapter import Adapter, LoraWeight
from loraserve.lora.delta import LoraBatch
from loraserve.model.context import AttnMeta, StepContext, set_context


def _adapter(i: int, weights: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]) -> Adapter:
    g = torch.Generator().manual_seed(i)
    ws = {
        t: LoraWeight(torch.randn(sa, generator=g), torch.randn(sb, generator=g), 0.5 * (i + 1))
        for t, (sa, sb) in weights.items()
    }
    return Adapter(f"a{i}", Path(f"a{i}"), f"c{i}", ws, id=i)


@pytest.mark.parametrize("contiguous", [False, True])
def test_lora_batch_rows(contiguous: bool) -> None:
    """Each row gets Σₐ sₐ·fₐ·Bₐ Aₐ x for its own mix; rows outside the spans stay bit-equal."""
    adapters = {
        0: _adapter(0, {"t": ((2, 16), (24, 2)), "output.weight": ((2, 16), (24, 2))}),
        1: _adapter(1, {"t": ((3, 16), (24, 3)), "e": ((3, 5, 16), (3, 24, 5))}),
        2: _adapter(2, {"e": ((3, 4, 16), (3, 24, 4)), "output.weight": ((4, 16), (24, 4))}),
    }
    mixes = [{0: 1.0}, {0: -0.5, 1: 2.0}, {2: 1.0}, {1: -1.0, 2: 0.25}]
    starts = [0, 2, 4, 5] if contiguous else [1, 4, 6, 8]
    spans = [
        (s, s + (2 if j != 2 else 1), m) for j, (s, m) in enumerate(zip(starts, mixes, strict=True))
    ]
    batch = LoraBatch(spans, adapters)
    mix_of = {r: m for s, e, m in spans for r in range(s, e)}
    x, y = torch.randn(10, 16), torch.randn(10, 24)  # apply adds to its y in place: copies

    def want(target: str, rows: list[int], expert: int | None = None) -> torch.Tensor:
        out = y[rows].clone()
        for k, r in enumerate(rows):
            for i, s in mix_of.get(r, {}).items():
                if (w := adapters[i].weights.get(target)) is not None:
                    a, b = (w.a, w.b) if expert is None else (w.a[expert], w.b[expert])
                    out[k] += s * w.factor * (b @ (a @ x[r]))
        return out

    dtype = torch.float32

    def check(got: torch.Tensor, ref: torch.Tensor) -> None:
        assert (got.float() - ref).abs().max() <= 1e-5 * ref.abs().max()

    got = batch.apply("t", x.to(dtype), y.to(dtype, copy=True)).float()
    check(got, want("t", list(range(10))))
    base = [r for r in range(10) if r not in mix_of]
    assert torch.equal(got[base], y.to(dtype, copy=True)[base].float())
    rows = [9, 2, 6, 3, 5]
    got = batch.apply_expert(
        "e", 1, x[rows].to(dtype), y[rows].to(dtype, copy=True), torch.tensor(rows)
    )
    check(got, want("e", rows, expert=1))
    logits_rows = [1, 3, 6, 9]
    z = torch.zeros(0, dtype=torch.int32)
    attn = AttnMeta(torch.zeros(0, dtype=torch.long), torch.zeros(1, dtype=torch.long), z, z)
    set_context(StepContext(torch.zeros(0, dtype=torch.long), attn, torch.tensor(logits_rows)))
    try:
        got = batch.apply(
            "output.weight", x[logits_rows].to(dtype), y[logits_rows].to(dtype, copy=True)
        )
    finally:
        set_context(None)
    check(got, want("output.weight", logits_rows))
