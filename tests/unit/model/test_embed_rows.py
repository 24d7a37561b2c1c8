"""Embedding rows dequantized in C (`kernels/embed_rows.c`) equal `model.dequant`'s torch
routine (itself gguf-py's numpy reference) bit for bit, and leave non-finite scales to it."""

from __future__ import annotations

import pytest
import torch

from loraserve.kernels import backend
from loraserve.kernels.embed_rows import dequant_rows
from loraserve.model.dequant import dequantize

needs_c = pytest.mark.skipif(backend() != "c", reason="no C kernels")
BLOCKS = {14: (256, 210, 208), 8: (32, 34, 0)}  # type: (values, bytes, offset of d)


def _rows(ggml_type: int, n: int, k: int, seed: int) -> torch.Tensor:
    """n rows of k values of random blocks whose f16 scale d is finite (subnormals too)."""
    vals, size, at = BLOCKS[ggml_type]
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, 256, (n * k // vals, size), generator=g, dtype=torch.uint8)
    b[:, at + 1] &= 0xBB  # the f16 exponent's top bit cleared: never inf or NaN
    b[::7, at + 1] &= 0x83  # and some subnormal scales
    return b.reshape(n, -1)


@needs_c
@pytest.mark.parametrize("ggml_type", [14, 8])
def test_rows_equal_the_torch_dequantizer(ggml_type: int) -> None:
    k = 512
    rows = _rows(ggml_type, 9, k, ggml_type)
    got = dequant_rows(rows, ggml_type, k)
    assert got is not None
    want = dequantize(rows, ggml_type, (9, k))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    one = dequant_rows(rows[4:5], ggml_type, k)  # a row alone: the same bits
    assert one is not None and torch.equal(one[0], got[4])


@needs_c
def test_non_finite_scales_and_other_types_are_left_to_torch() -> None:
    rows = _rows(8, 2, 64, 0)
    rows[1, 1] = 0x7C  # d = inf
    assert dequant_rows(rows, 8, 64) is None
    assert dequant_rows(rows, 12, 64) is None  # Q4_K: not read here
