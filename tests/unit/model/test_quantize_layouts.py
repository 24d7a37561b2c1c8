"""Our Q3_K / IQ4_NL / IQ4_XS quantizers (`loraserve.model.quantize`) write the blocks the gguf
package reads: its independent `dequantize` of our bytes gives the input back within each
type's quantization error, all-zero rows give zeros, and a row's blocks do not depend on
the other rows. (Byte equality with llama-quantize is checked on the real model:
tests/real_model/test_requant_fidelity.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from loraserve.model.quantize import quantize

# relative rms error bounds, about 1.5x what 3-bit and 4-bit levels give on normal values
BOUND = {"Q3_K": 0.22, "IQ4_NL": 0.11, "IQ4_XS": 0.11}


@pytest.mark.parametrize("name", list(BOUND))
def test_gguf_reads_back_our_blocks(name: str) -> None:
    t = GGMLQuantizationType[name]
    rng = np.random.default_rng(int(t))
    x = (rng.standard_normal((16, 1024)) * rng.uniform(0.01, 3, (16, 1))).astype(np.float32)
    raw = quantize(x, int(t))
    y = dequantize(raw, t)  # [16, 1024]
    rel = np.sqrt(((y - x) ** 2).mean(axis=1)) / np.sqrt((x**2).mean(axis=1))
    assert rel.max() < BOUND[name], f"{name}: relative rms error {rel.max():.3f}"
    assert np.all(dequantize(quantize(np.zeros((2, 512), np.float32), int(t)), t) == 0)
    assert np.array_equal(quantize(x[5:6], int(t)), raw[5:6])  # rows quantize alone
