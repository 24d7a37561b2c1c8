"""The matmul kernels on GGUF weights: each equals the float64 product of gguf-py's dequantized
weights (the oracle) within the error of its activation quantization, and every output row
is bitwise the same whatever else is in the batch (C kernels and the torch fallback)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as RefType
from gguf import quants

import loraserve.kernels as K
from loraserve.model.dequant import GGML_QUANT_SIZES, GGML_TYPE
from loraserve.model.projection import Matrix
from tests.unit.model.quant_util import (
    QUANT,
    activations_as_used,
    dequantized,
    quantized,
    random_rows,
)


@pytest.mark.parametrize("name", QUANT)
def test_quantized_kernel_equals_dequantized_reference(name: str, backend: str) -> None:
    rng = np.random.default_rng(GGML_TYPE[name])
    n, k, m = 40, 512, 6
    raw = random_rows(rng, name, n, k)
    w = dequantized(raw, name, n, k)  # [n, k] float64: the oracle's weights
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    xa = quantized(x, name)
    y = K.qmatmul(xa, torch.from_numpy(raw), GGML_TYPE[name]).double().numpy()
    scale = np.abs(w).sum(1).max() * np.abs(activations_as_used(xa)).max()
    # the same quantized activations: only float32 rounding remains
    np.testing.assert_allclose(y, activations_as_used(xa) @ w.T, rtol=0, atol=2e-6 * scale)
    # against the float activations: within the int8 rounding of the activations
    # (half a step of each block's scale per value)
    step = xa.d.double().repeat_interleave(xa.block, dim=1).numpy() / 2  # [m, k]
    bound = step @ np.abs(w).T
    err = np.abs(y - x.double().numpy() @ w.T)
    assert (err <= bound * (1 + 1e-5) + 1e-6 * scale).all()


@pytest.mark.parametrize("k", [256, 2048])  # 2048: 16+ rows take blocks of 8 (part_rows)
@pytest.mark.parametrize("name", QUANT)
def test_quantized_rows_are_independent_of_the_batch(name: str, k: int, backend: str) -> None:
    rng = np.random.default_rng(7)
    n = 26  # not a multiple of the 4-row tiles
    raw = torch.from_numpy(random_rows(rng, name, n, k))
    x = torch.from_numpy(rng.standard_normal((64, k)).astype(np.float32))
    alone = torch.cat([K.qmatmul(quantized(x[i : i + 1], name), raw, GGML_TYPE[name])
                       for i in range(64)])  # fmt: skip
    for size in (2, 3, 8, 16, 17, 24, 64):  # 16 and 24: where rows are decoded once
        lo = int(rng.integers(0, 64 - size + 1))
        batch = K.qmatmul(quantized(x[lo : lo + size], name), raw, GGML_TYPE[name])
        assert torch.equal(batch, alone[lo : lo + size]), f"{name}: batch of {size} differs"


@pytest.mark.parametrize("name", ["Q8_0", "Q5_0"])
def test_decode_rows_of_a_large_matrix_equal_the_four_row_tiles(name: str) -> None:
    """Above 8 MB a legacy matrix reads one weight row at a time for a single decode row,
    four at a time for 2 or 3 rows and below 8 MB: the same bits, and the same as inside a
    batch."""
    if K.backend() != "c":
        pytest.skip("no C compiler on this machine")
    rng = np.random.default_rng(11)
    k = 256
    n = (9 << 20) // (GGML_QUANT_SIZES[GGML_TYPE[name]][1] * k // 32)  # rows of > 8 MB
    raw = torch.from_numpy(random_rows(rng, name, n, k))
    x = torch.from_numpy(rng.standard_normal((5, k)).astype(np.float32))
    big = [K.qmatmul(quantized(x[:m], name), raw, GGML_TYPE[name]) for m in (1, 2, 3, 5)]
    small = K.qmatmul(quantized(x[:3], name), raw[:64].contiguous(), GGML_TYPE[name])
    for y in big[1:]:
        assert torch.equal(y[:1], big[0])
    assert torch.equal(big[2][:, :64], small)
    assert torch.equal(big[3][:3], big[2])


@pytest.mark.parametrize("block", [32, 256])
def test_activation_quantizer_rounds_as_ggml(block: int) -> None:
    """The vectorised quantizer gives ggml-cpu's numbers (x86 quantize_row_q8_0,
    quantize_row_q8_K_ref): q = x * (127 / amax) as a float32 product rounded half to even,
    on every value, ties and near-ties included; the scale fp16(amax / 127) for blocks of 32
    (Q8_0 stores it in fp16), 1 / (127 / amax) for 256 (Q8_K); per-16 sums exact; a block
    with inf or NaN gets q = 0 and a NaN scale."""
    if K.backend() != "c":
        pytest.skip("no C compiler on this machine")
    rng = np.random.default_rng(block)
    m, k = 6, 1024
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 10, (m, 1))).astype(np.float32)
    x[0, :block] = np.arange(block) % 7 - 3 + 0.5  # amax 3.5: ties at x * 127 / 3.5
    x[1, :block] = 0.0
    x[1, block - 1] = 127.0
    x[1, : block - 1] = np.array([0.5, -0.5, 1.5, -2.5, 0.49999997, -0.49999997, 126.5])[
        np.arange(block - 1) % 7
    ]  # id = 1: exact ties and the float just below one half
    x[2, 3], x[3, block + 5] = np.inf, np.nan
    xa = K.quantize_rows(torch.from_numpy(x), block)
    nb = k // block
    xb = x.reshape(m, nb, block)
    amax = np.abs(xb).max(-1)
    inv = np.where(amax != 0, np.float32(127.0) / np.where(amax != 0, amax, 1), 0)
    inv = inv.astype(np.float32)
    with np.errstate(invalid="ignore"):  # the inf and NaN blocks
        v = (xb * inv[..., None]).astype(np.float32)  # float32 product
    ref = np.rint(v)  # ties to even
    if block == 32:
        dd = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    else:
        dd = np.where(inv != 0, np.float32(1.0) / np.where(inv != 0, inv, 1), 0)
    bad = ~np.isfinite(xb).all(-1)
    ref[bad] = 0
    q = xa.q.numpy().reshape(m, nb, block)
    assert (q[1, 0] != np.trunc(v[1, 0] + np.copysign(0.5, v[1, 0]))).any(), "no tie tested"
    assert (q == ref).all()
    d = xa.d.numpy()
    assert np.isnan(d[bad]).all() and (d[~bad] == dd[~bad]).all()
    sums = ref.reshape(m, k // 16, 16).sum(-1)
    if block == 256:
        assert (xa.ms.numpy() == sums).all()
    else:
        want = (np.repeat(d, 2, axis=1) * sums.astype(np.float32)).astype(np.float32)
        assert np.array_equal(xa.ms.numpy(), want, equal_nan=True)


def test_activation_quantization_matches_llama_cpp_q8_0() -> None:
    """Per-32 blocks as ggml's Q8_0: the same integers as gguf-py's quantizer (ggml's
    reference, whose roundf and 1 / d differ from the x86 path only at exact ties)."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 128)) * rng.uniform(0.01, 10, (5, 1))).astype(np.float32)
    x[0, :32] = 0.0
    xa = K.quantize_rows(torch.from_numpy(x))
    ref = np.asarray(quants.quantize(x, RefType.Q8_0)).view(np.uint8).reshape(5, 4, 34)
    assert np.array_equal(xa.q.numpy().reshape(5, 4, 32), ref[..., 2:].view(np.int8))
    sums = xa.q.reshape(5, 8, 16).sum(-1).float()
    assert torch.equal(xa.ms, xa.d.repeat_interleave(2, dim=1) * sums)


def test_non_finite_inputs_give_non_finite_outputs(backend: str) -> None:
    rng = np.random.default_rng(2)
    raw = torch.from_numpy(random_rows(rng, "Q4_K", 8, 256))
    x = torch.from_numpy(rng.standard_normal((3, 256)).astype(np.float32))
    x[1, 100] = float("nan")
    x[2, 7] = float("inf")
    y = K.qmatmul(quantized(x, "Q4_K"), raw, GGML_TYPE["Q4_K"])
    assert torch.isfinite(y[0]).all()
    assert not torch.isfinite(y[1]).any() and not torch.isfinite(y[2]).any()


def test_unsupported_type_is_refused_naming_tensor_and_type() -> None:
    with pytest.raises(ValueError, match=r"'blk.0.ffn_up.weight'.*NVFP4"):
        Matrix.from_raw("blk.0.ffn_up.weight", torch.zeros(144, dtype=torch.uint8), 40, (1, 256))


@pytest.mark.parametrize(
    "name", ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
)
def test_in_place_decoding_equals_the_unpacked_rows_bitwise(name: str, monkeypatch) -> None:
    """The SIMD decoders that read the common types straight from their blocks give bitwise
    the numbers of the scalar unpackers (which the reference test checks against gguf-py),
    for 4 weight rows at a time (2 activation rows), and 8 and 1 rows of one weight row."""
    if K.backend() != "c":
        pytest.skip("no C compiler on this machine")
    rng = np.random.default_rng(11)
    raw = torch.from_numpy(random_rows(rng, name, 33, 512))
    x = torch.from_numpy(rng.standard_normal((9, 512)).astype(np.float32))
    for m in (2, 9):
        xa = quantized(x[:m], name)
        direct = K.qmatmul(xa, raw, GGML_TYPE[name])
        monkeypatch.setenv("LORASERVE_KERNEL_UNPACK", "1")
        assert torch.equal(K.qmatmul(xa, raw, GGML_TYPE[name]), direct), m
        monkeypatch.delenv("LORASERVE_KERNEL_UNPACK")
