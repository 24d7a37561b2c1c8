"""Prompt-sized matmuls through decoded groups of 8 rows (kernels/packed_kb.h: Q2_K, Q3_K,
Q5_K, Q6_K in the file's layout and Q6_K packed, the grid and ternary types; packed_zb.h on
AVX-512: the packed Q4_0, Q5_0, Q5_1, Q8_0, IQ4_NL and MXFP4, in pairs of groups): bitwise the
numbers of each row alone (the decode-step paths) and of the rows' own prompt paths
(``LORASERVE_KERNEL_NO_KBYTES=1``), whatever the tile of activation rows, a task's group
count (a lone last group) or the columns of a multi-part call; and gguf-py's float64
dequantization within float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import loraserve.kernels as K
from loraserve.model.dequant import GGML_TYPE
from tests.unit.model.quant_util import activations_as_used, dequantized, quantized, random_rows

pytestmark = pytest.mark.skipif(K.backend() != "c", reason="needs the C kernels")
TYPES = ["Q2_K", "Q3_K", "Q5_K", "Q6_K", "Q6_K/packed", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
         "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "Q4_0/packed", "Q5_0/packed", "Q5_1/packed",
         "Q8_0/packed", "IQ4_NL/packed", "MXFP4/packed"]  # fmt: skip


def _weights(name: str, n: int, k: int, seed: int) -> tuple[np.ndarray, torch.Tensor, int]:
    """Random rows of ``name`` (file bytes), the rows the kernel reads, and its kernel type."""
    base = name.split("/")[0]
    raw = random_rows(np.random.default_rng(seed), base, n, k)
    t = GGML_TYPE[base]
    if name.endswith("/packed"):
        packed = K.pack_rows(torch.from_numpy(raw), t, k)
        assert packed is not None
        return raw, packed, K.PACKED | t
    return raw, torch.from_numpy(raw), t


@pytest.mark.parametrize("name", TYPES)
def test_prompt_rows_equal_each_row_alone_and_the_row_paths(name: str, monkeypatch) -> None:
    k = 768
    raw, w, t = _weights(name, 40, k, 5)  # 5 groups: a task of 4, then a lone group
    rng = np.random.default_rng(6)
    x = torch.from_numpy(rng.standard_normal((39, k)).astype(np.float32))
    base = name.split("/")[0]
    alone = torch.cat([K.qmatmul(quantized(x[i : i + 1], base), w, t) for i in range(39)])
    for m in (16, 17, 18, 19, 39):  # the last tile of 4, 1, 2, 3 rows
        xa = quantized(x[:m], base)
        y = K.qmatmul(xa, w, t)
        assert torch.equal(y, alone[:m]), (name, m)
        monkeypatch.setenv("LORASERVE_KERNEL_NO_KBYTES", "1")
        assert torch.equal(K.qmatmul(xa, w, t), y), (name, m)
        monkeypatch.delenv("LORASERVE_KERNEL_NO_KBYTES")
    # against the float64 dequantization, on the same quantized activations
    xa = quantized(x, base)
    ref = dequantized(raw, base, 40, k)
    y = K.qmatmul(xa, w, t).double().numpy()
    scale = np.abs(ref).sum(1).max() * np.abs(activations_as_used(xa)).max()
    np.testing.assert_allclose(y, activations_as_used(xa) @ ref.T, rtol=0, atol=2e-6 * scale)


@pytest.mark.parametrize("name", ["Q3_K", "Q2_K"])
def test_multi_part_columns_and_groups_of_a_task(name: str) -> None:
    """Parts side by side (gate|up) with different group counts: each its columns, the bits
    of one matrix at a time."""
    k = 512
    _, a, t = _weights(name, 72, k, 1)  # 9 groups: tasks of 4, 4, 1
    _, b, _ = _weights(name, 16, k, 2)
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((21, k)).astype(np.float32))
    y = torch.zeros(21, 100)
    K.QuantizedParts([(a, t, 0), (b, t, 80)])(x, y)
    xa = quantized(x, name)
    assert torch.equal(y[:, :72], K.qmatmul(xa, a, t))
    assert torch.equal(y[:, 80:96], K.qmatmul(xa, b, t))
    assert not y[:, 72:80].any() and not y[:, 96:].any()
