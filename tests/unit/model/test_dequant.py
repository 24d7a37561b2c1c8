"""Dequantization is bit-identical to gguf-py's numpy reference for every supported type."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES as REF_SIZES
from gguf.constants import GGMLQuantizationType as RefType
from hypothesis import given, settings
from hypothesis import strategies as st

from loraserve.model.dequant import (
    GGML_BLOCK_SIZE,
    GGML_QUANT_SIZES,
    GGML_TYPE,
    GGML_TYPE_NAME,
    GGML_TYPE_SIZE,
    SUPPORTED_TYPES,
    UnsupportedQuantError,
    dequantize,
    tensor_nbytes,
)

# byte offsets of the f16 scale fields inside one block
HALF_FIELDS: dict[str, tuple[int, ...]] = {
    "F16": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "F32": (), "BF16": (), "IQ4_NL": (0,), "IQ4_XS": (0,), "MXFP4": (), "TQ1_0": (52,),
    "TQ2_0": (64,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ1_S": (0,), "IQ1_M": (),
}  # fmt: skip
SUPPORTED = sorted(GGML_TYPE_NAME[t] for t in SUPPORTED_TYPES)
QUANTIZABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "TQ1_0",
               "TQ2_0"]  # fmt: skip


def reference(raw: np.ndarray, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """gguf-py's dequantization of raw bytes `(rows, row_bytes)`, as float32 `shape`."""
    rtype = RefType[name]
    with np.errstate(all="ignore"):
        if name in ("F32", "F16"):
            out = quants.dequantize(raw.view({"F32": np.float32, "F16": np.float16}[name]), rtype)
        else:
            out = quants.dequantize(raw, rtype)
    return np.asarray(out, dtype=np.float32).reshape(shape)


def assert_bits_equal(ours: torch.Tensor, ref: np.ndarray) -> None:
    assert ours.dtype == torch.float32
    assert tuple(ours.shape) == ref.shape
    np.testing.assert_array_equal(ours.numpy().view(np.uint32), ref.view(np.uint32))


def random_blocks(rng: np.random.Generator, name: str, n_rows: int, blocks_per_row: int):
    """Random bytes of (n_rows, row_bytes) with every f16 scale field a random finite half."""
    size = GGML_TYPE_SIZE[GGML_TYPE[name]]
    raw = rng.integers(0, 256, size=(n_rows, blocks_per_row, size), dtype=np.uint8)
    for off in HALF_FIELDS[name]:
        halves = rng.standard_normal((n_rows, blocks_per_row)).astype(np.float16)
        raw[..., off : off + 2] = halves.view(np.uint8).reshape(n_rows, blocks_per_row, 2)
    if name == "IQ1_M":  # its fp16 d lies in the top nibbles of the four scale words
        h = rng.standard_normal((n_rows, blocks_per_row)).astype(np.float16).view(np.uint16)
        for i in range(4):
            hi = raw[..., 49 + 2 * i] & 0x0F | (((h >> (4 * i)) & 0xF) << 4).astype(np.uint8)
            raw[..., 49 + 2 * i] = hi
    if name == "F32":
        raw = rng.standard_normal((n_rows, blocks_per_row)).astype(np.float32).view(np.uint8)
    return raw.reshape(n_rows, -1)


def test_type_table_matches_gguf() -> None:
    for t in RefType:
        assert GGML_TYPE[t.name] == t.value
        assert GGML_QUANT_SIZES[t.value] == REF_SIZES[t]
        assert (GGML_BLOCK_SIZE[t.value], GGML_TYPE_SIZE[t.value]) == REF_SIZES[t]
    assert set(SUPPORTED) == set(HALF_FIELDS)


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_quantized_by_gguf_roundtrips_bit_identically(name: str) -> None:
    rng = np.random.default_rng(0)
    block = GGML_BLOCK_SIZE[GGML_TYPE[name]]
    x = (rng.standard_normal((6, block * 8)) * rng.uniform(0.01, 100, (6, 1))).astype(np.float32)
    x[0, : block * 2] = 0.0  # all-zero blocks
    raw = np.ascontiguousarray(quants.quantize(x, RefType[name])).view(np.uint8)
    ours = dequantize(raw, GGML_TYPE[name], x.shape)  # (6, block * 8)
    assert_bits_equal(ours, reference(raw, name, x.shape))


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from(SUPPORTED),
    seed=st.integers(0, 2**32 - 1),
    n_rows=st.integers(1, 5),
    blocks_per_row=st.integers(1, 6),
)
def test_random_blocks_bit_identical(
    name: str, seed: int, n_rows: int, blocks_per_row: int
) -> None:
    rng = np.random.default_rng(seed)
    raw = random_blocks(rng, name, n_rows, blocks_per_row)
    shape = (n_rows, blocks_per_row * GGML_BLOCK_SIZE[GGML_TYPE[name]])
    assert_bits_equal(dequantize(raw, GGML_TYPE[name], shape), reference(raw, name, shape))


@pytest.mark.parametrize("name", SUPPORTED)
def test_a_single_block_bit_identical(name: str) -> None:
    """One row of one block: its fields sit at offsets a wider slice would not start on (a
    u32 field two bytes in cannot be viewed in place), which random sizes reach only by luck."""
    raw = random_blocks(np.random.default_rng(7), name, 1, 1)
    shape = (1, GGML_BLOCK_SIZE[GGML_TYPE[name]])
    assert_bits_equal(dequantize(raw, GGML_TYPE[name], shape), reference(raw, name, shape))


@pytest.mark.parametrize("name", SUPPORTED)
def test_arbitrary_bytes_with_nan_and_inf_scales(name: str) -> None:
    """Unsanitised bytes: NaN exactly where the reference has NaN, every other value bit-equal.

    A NaN's sign and payload depend on which operand the CPU's vector loop propagates, so they
    are compared only where no arithmetic happens (F16, BF16, including signalling NaNs).
    """
    rng = np.random.default_rng(1)
    block, size = GGML_QUANT_SIZES[GGML_TYPE[name]]
    n_blocks = 4096 // size + 64
    raw = rng.integers(0, 256, size=(4, n_blocks * size), dtype=np.uint8)
    if name in ("F16", "BF16"):
        raw[0, :] = np.arange(65536, dtype=np.uint16).view(np.uint8)[: raw.shape[1]]
        raw[1, :] = np.arange(65536, dtype=np.uint16).view(np.uint8)[-raw.shape[1] :]
    shape = (4, n_blocks * block)
    ours, ref = dequantize(raw, GGML_TYPE[name], shape), reference(raw, name, shape)
    if name in ("F32", "F16", "BF16"):
        assert_bits_equal(ours, ref)
        return
    nan = np.isnan(ref)
    np.testing.assert_array_equal(ours.isnan().numpy(), nan)
    np.testing.assert_array_equal(ours.numpy()[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_large_tensor_spanning_several_chunks() -> None:
    rng = np.random.default_rng(2)
    raw = random_blocks(rng, "Q4_K", 640, 8)  # 1.3M values: several steps of the chunk loop
    shape = (640, 8 * 256)
    assert_bits_equal(dequantize(raw, GGML_TYPE["Q4_K"], shape), reference(raw, "Q4_K", shape))


def test_accepts_torch_and_any_raw_layout() -> None:
    rng = np.random.default_rng(3)
    raw = random_blocks(rng, "Q6_K", 3, 2)
    shape = (3, 2, 256)
    ref = reference(raw, "Q6_K", shape)
    assert_bits_equal(dequantize(torch.from_numpy(raw.copy()), GGML_TYPE["Q6_K"], shape), ref)
    assert_bits_equal(dequantize(raw.reshape(-1), GGML_TYPE["Q6_K"], shape), ref)


def test_read_only_input_is_not_copied_or_warned_about(recwarn: pytest.WarningsRecorder) -> None:
    raw = np.frombuffer(np.float32([1.5, -2.0]).tobytes(), dtype=np.uint8)
    out = dequantize(raw, GGML_TYPE["F32"], (2,))
    assert out.tolist() == [1.5, -2.0]
    out[0] = 7.0  # the result owns its memory
    assert not recwarn.list


def test_unsupported_type_names_tensor_and_type() -> None:
    with pytest.raises(UnsupportedQuantError, match=r"blk\.0\.ffn_up\.weight.*NVFP4"):
        dequantize(np.zeros(144, np.uint8), GGML_TYPE["NVFP4"], (256,), name="blk.0.ffn_up.weight")
    with pytest.raises(UnsupportedQuantError, match="type99"):
        dequantize(np.zeros(4, np.uint8), 99, (1,))
    assert issubclass(UnsupportedQuantError, ValueError)


def test_size_mismatches_are_clear() -> None:
    with pytest.raises(ValueError, match=r"'w'.*needs 68 bytes, got 34"):
        dequantize(np.zeros(34, np.uint8), GGML_TYPE["Q8_0"], (2, 32), name="w")
    with pytest.raises(ValueError, match="not a multiple of the Q4_K block size 256"):
        dequantize(np.zeros(144, np.uint8), GGML_TYPE["Q4_K"], (2, 128))
    with pytest.raises(TypeError, match="uint8"):
        dequantize(np.zeros(2, np.float32), GGML_TYPE["F32"], (2,))


def test_tensor_nbytes() -> None:
    assert tensor_nbytes(GGML_TYPE["Q8_0"], (262144, 640)) == 262144 * 20 * 34
    assert tensor_nbytes(GGML_TYPE["F32"], (640,)) == 2560
    assert tensor_nbytes(GGML_TYPE["F32"], ()) == 4
