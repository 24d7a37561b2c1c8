"""The attention tests' toolkit: the kernel and its fallback as test parameters, and a batch of
items laid out as the runner lays it out."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from loraserve.kernels.attention import attention_c, attention_torch, backend

Impl = Callable[..., torch.Tensor]
IMPLS = [
    pytest.param(attention_c, id="c", marks=pytest.mark.skipif(backend() != "c", reason="no cc")),
    pytest.param(attention_torch, id="torch"),
]


def attend(
    impl: Impl,
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    slots: Sequence[torch.Tensor],
    items: Sequence[tuple[int, int, int]],
    window: int = 0,
    scale: float = 0.125,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attend a batch of items (sequence, start, n) as the runner lays it out: each item's
    slot list holds positions 0..start+n-1; q [T, H, D] holds the items' rows in order."""
    lists, off, row_seq, nkeys = [], [0], [], []
    for b, (s, start, n) in enumerate(items):
        lists.append(slots[s][: start + n])
        off.append(off[-1] + start + n)
        row_seq += [b] * n
        nkeys += range(start + 1, start + n + 1)
    i32, i64 = torch.int32, torch.long
    return impl(q, *kv, torch.cat(lists), torch.tensor(off, dtype=i64),
                torch.tensor(row_seq, dtype=i32), torch.tensor(nkeys, dtype=i32), scale,
                window, softcap, sinks)  # fmt: skip
