"""Rows repacked 8 to a group (kernels/packed.h): the same values as the file's bytes, the
kernels on them against gguf-py's dequantized float64 reference, and row-independent."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import loraserve.kernels as K
from loraserve.model.dequant import GGML_TYPE
from loraserve.model.projection import Matrix, Projection
from tests.unit.model.quant_util import (
    activations_as_used,
    dequantized,
    quantized,
    random_rows,
)

PACKABLE = [
    "Q4_0",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "TQ2_0",
    "MXFP4",
]

pytestmark = pytest.mark.skipif(K.backend() != "c", reason="packing needs the C kernels")


def packed(raw: torch.Tensor, name: str, k: int) -> torch.Tensor:
    pk = K.pack_rows(raw, GGML_TYPE[name], k)
    assert pk is not None, f"{name} rows were not packed"
    return pk


@pytest.mark.parametrize("name", PACKABLE)
def test_unpacking_gives_the_file_bytes_back(name: str) -> None:
    rng = np.random.default_rng(3)
    k = 512
    raw = torch.from_numpy(random_rows(rng, name, 24, k))
    pk = packed(raw, name, k)
    # the same bit width (Q3_K: its 6-bit scales as bytes, 1.036x)
    assert pk.numel() >= raw.numel() and pk.numel() <= raw.numel() * 1.04
    assert torch.equal(K.unpack_rows(pk, GGML_TYPE[name], k, raw.shape[1]), raw)


@pytest.mark.parametrize("k", [256, 2048])
@pytest.mark.parametrize("name", PACKABLE)
def test_packed_kernel_equals_the_dequantized_reference(name: str, k: int) -> None:
    rng = np.random.default_rng(GGML_TYPE[name] + k)
    n, m = 48, 19  # from 16 rows on, tasks of 4 groups (pairs of groups: packed_z.h)
    raw = random_rows(rng, name, n, k)
    w = dequantized(raw, name, n, k)  # [n, k] float64: the oracle's weights
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    xa = quantized(x, name)
    pk = packed(torch.from_numpy(raw), name, k)
    y = K.qmatmul(xa, pk, GGML_TYPE[name] | K.PACKED).double().numpy()
    scale = np.abs(w).sum(1).max() * np.abs(activations_as_used(xa)).max()
    np.testing.assert_allclose(y, activations_as_used(xa) @ w.T, rtol=0, atol=2e-6 * scale)


@pytest.mark.parametrize("name", PACKABLE)
def test_packed_rows_are_independent_of_the_batch(name: str) -> None:
    rng = np.random.default_rng(5)
    k = 512
    pk = packed(torch.from_numpy(random_rows(rng, name, 40, k)), name, k)
    t = GGML_TYPE[name] | K.PACKED
    x = torch.from_numpy(rng.standard_normal((64, k)).astype(np.float32))
    alone = torch.cat([K.qmatmul(quantized(x[i : i + 1], name), pk, t) for i in range(64)])
    for size in (2, 3, 4, 5, 7, 17, 64):  # the 4-row tiles and every remainder
        lo = int(rng.integers(0, 64 - size + 1))
        batch = K.qmatmul(quantized(x[lo : lo + size], name), pk, t)
        assert torch.equal(batch, alone[lo : lo + size]), f"{name}: batch of {size} differs"


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "TQ2_0"])
def test_packed_k_quants_equal_the_rows_read_in_place_bitwise(name: str) -> None:
    """Packed K-quants keep kquant.h's float sequence: the same bits as the file's layout."""
    rng = np.random.default_rng(9)
    k = 1024
    raw = torch.from_numpy(random_rows(rng, name, 32, k))
    xa = quantized(torch.from_numpy(rng.standard_normal((17, k)).astype(np.float32)), name)
    direct = K.qmatmul(xa, raw, GGML_TYPE[name])
    assert torch.equal(K.qmatmul(xa, packed(raw, name, k), GGML_TYPE[name] | K.PACKED), direct)


def test_matrix_packs_only_whole_groups_and_keeps_its_values(monkeypatch) -> None:
    rng = np.random.default_rng(1)
    k = 256
    raw = torch.from_numpy(random_rows(rng, "Q5_0", 16, k))
    m = Matrix.from_raw("w", raw, GGML_TYPE["Q5_0"], (16, k))
    p = m.pack()
    assert p.packed and p.kernel_type == GGML_TYPE["Q5_0"] | K.PACKED
    assert torch.equal(p.file_rows(), raw)
    assert torch.equal(p.dequantized(), m.dequantized())
    idx = torch.tensor([3, 1, 15])
    assert torch.equal(p.rows(idx).data, m.rows(idx).data)
    odd = Matrix.from_raw("w", raw[:12].contiguous(), GGML_TYPE["Q5_0"], (12, k))
    assert not odd.pack().packed  # 12 rows: not whole groups of 8
    q41 = Matrix.from_raw("w", torch.from_numpy(random_rows(rng, "Q4_1", 16, k)), 3, (16, k))
    assert not q41.pack().packed  # no packed kernel for Q4_1: the file's layout
    monkeypatch.setenv("LORASERVE_KERNEL_NO_PACK", "1")
    assert not m.pack().packed


def test_projection_of_packed_and_file_layout_parts_equals_each_part_alone() -> None:
    """q|k|v-style parts of mixed layouts and types in one kernel call."""
    rng = np.random.default_rng(2)
    k = 512
    specs = [("Q4_K", 16), ("Q5_0", 12), ("Q8_0", 8), ("Q4_1", 8)]
    mats = []
    for i, (name, n) in enumerate(specs):
        raw = torch.from_numpy(random_rows(rng, name, n, k))
        mats.append(Matrix.from_raw(f"p{i}", raw, GGML_TYPE[name], (n, k)).pack())
    assert [m.packed for m in mats] == [True, False, True, False]
    proj = Projection("fused", mats)
    x = torch.from_numpy(rng.standard_normal((6, k)).astype(np.float32))
    y = proj.base(x)
    col = 0
    for m in mats:
        xa = K.quantize_rows(x, K.activation_block(m.ggml_type))
        assert torch.equal(y[:, col : col + m.shape[0]], K.qmatmul(xa, m.data, m.kernel_type))
        col += m.shape[0]


def test_dense_q6_k_packing_is_the_expert_kernels_layout() -> None:
    """Dense Q6_K rows are packed into pack_q6k.h's layout byte for byte, so a matrix packed
    by either reads the same in both the dense and the grouped expert kernels."""
    from loraserve.kernels.pack_q6k import pack_q6k

    rng = np.random.default_rng(14)
    k = 512
    raw = torch.from_numpy(random_rows(rng, "Q6_K", 24, k))
    assert torch.equal(packed(raw, "Q6_K", k), pack_q6k(raw, k))
