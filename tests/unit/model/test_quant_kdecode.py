"""K-form rows read in place (kquant.h: scales and values from the block on the fly; Q2_K's,
Q3_K's and the ternary types' values unsigned, their offset off once per super-block; the
grid types' magnitudes and signs from iq_chunk.h) give bitwise the numbers of the rows
unpacked into the buffer, at decode and prompt sizes (the unpacked values are checked
against gguf-py in test_kernels)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import loraserve.kernels as K
from loraserve.model.dequant import GGML_TYPE
from tests.unit.model.quant_util import quantized, random_rows

pytestmark = pytest.mark.skipif(K.backend() != "c", reason="needs the C kernels")


IN_PLACE = ["Q2_K", "Q3_K", "Q5_K", "TQ2_0", "TQ1_0", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
            "IQ3_S", "IQ1_S", "IQ1_M"]  # fmt: skip


@pytest.mark.parametrize("name", IN_PLACE)
def test_k_quant_in_place_equals_the_unpacked_rows_bitwise(name: str, monkeypatch) -> None:
    rng = np.random.default_rng(GGML_TYPE[name])
    raw = torch.from_numpy(random_rows(rng, name, 33, 768))
    x = torch.from_numpy(rng.standard_normal((21, 768)).astype(np.float32))
    for m in (1, 3, 5, 21):  # one row at a time, the 4-row tiles, and the blocked prompt rows
        xa = quantized(x[:m], name)
        direct = K.qmatmul(xa, raw, GGML_TYPE[name])
        monkeypatch.setenv("LORASERVE_KERNEL_UNPACK", "1")
        assert torch.equal(K.qmatmul(xa, raw, GGML_TYPE[name]), direct), m
        monkeypatch.delenv("LORASERVE_KERNEL_UNPACK")
