"""FusedLinear (q|k|v, gate|up as one matmul) equals its parts run one by one."""

from __future__ import annotations

import pytest
import torch

from loraserve.model.context import StepContext, set_context
from loraserve.model.layers import FusedLinear, Linear


class _Delta:
    """A LoraDelta adding a fixed per-target matrix; returns a new tensor for 'k' (as a
    delta implementation may) and adds in place for the others."""

    def __init__(self, deltas: dict[str, torch.Tensor]) -> None:
        self.deltas = deltas

    def apply(self, target: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        d = self.deltas.get(target)
        if d is None:
            return y
        if "attn_k" in target:
            return y + x @ d.t()
        return y.add_(x @ d.t())

    def apply_expert(self, *args: object) -> torch.Tensor:  # pragma: no cover - unused
        raise AssertionError


def _ctx(t: int, int8_rows: list[int] | None, lora: _Delta | None) -> StepContext:
    rows = None if int8_rows is None else torch.tensor(int8_rows, dtype=torch.long)
    return StepContext(
        slot_mapping=torch.zeros(t, dtype=torch.long),
        groups=[],
        logits_rows=torch.arange(t),
        lora=lora,
        int8_rows=rows,
    )


@pytest.mark.parametrize("int8_rows", [None, [1, 3], [0, 1, 2, 3]])
@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("k", [32, 12])  # 12: no int8 kernel for it, float weights only
def test_fused_equals_parts(int8_rows: list[int] | None, with_lora: bool, k: int) -> None:
    g = torch.Generator().manual_seed(0)
    names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]
    sizes = [16, 8, 8]
    ws = [torch.randn(n, k, generator=g) for n in sizes]
    bs = [torch.randn(n, generator=g) for n in sizes]
    parts = [
        Linear(nm, w, b, torch.float32, int8=True) for nm, w, b in zip(names, ws, bs, strict=True)
    ]
    fused = FusedLinear(
        "blk.0.attn_qkv.weight",
        list(zip(names, sizes, strict=True)),
        torch.cat(ws),
        torch.cat(bs),
        torch.float32,
        int8=True,
    )
    lora = None
    if with_lora:
        lora = _Delta(
            {names[0]: torch.randn(16, k, generator=g), names[1]: torch.randn(8, k, generator=g)}
        )
    x = torch.randn(4, k, generator=g)
    set_context(_ctx(4, int8_rows, lora))
    try:
        want = torch.cat([p(x) for p in parts], dim=1)
        got = fused(x)
    finally:
        set_context(None)
    assert (fused.w8 is not None) == (k % 16 == 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_parts_must_cover_the_outputs() -> None:
    with pytest.raises(ValueError, match="parts cover 8 of 12"):
        FusedLinear("f", [("a", 4), ("b", 4)], torch.randn(12, 3), None, torch.float32)
