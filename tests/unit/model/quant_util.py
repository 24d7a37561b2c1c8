"""Random GGUF rows of every quantization type, gguf-py's float64 dequantization of them (the
oracle), the activation rows as the kernels read them, and a tiny model whose matrices are of
several types: the toolkit of the kernel tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType as RefType
from gguf import quants

import loraserve.kernels as K
from loraserve.model.dequant import GGML_QUANT_SIZES, GGML_TYPE
from loraserve.model.loader import load_model
from tests.tiny import gguf_tensors, hf_model, write_gguf

ROOT = str(Path(__file__).resolve().parents[3])  # the repository
QUANT = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
         "IQ3_S", "IQ1_S", "IQ1_M"]  # fmt: skip
# f16 scale fields (offsets in the block) set to small finite halves in random blocks
HALVES = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_NL": (0,), "IQ4_XS": (0,), "MXFP4": (), "TQ1_0": (52,), "TQ2_0": (64,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ1_S": (0,), "IQ1_M": (),
}  # fmt: skip


def random_rows(rng: np.random.Generator, name: str, n: int, k: int) -> np.ndarray:
    """n rows of k values of type ``name`` as uint8 [n, row_bytes]: random quants, and
    scales of either sign around 0.02 (every field a valid block)."""
    block, size = GGML_QUANT_SIZES[GGML_TYPE[name]]
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for off in HALVES[name]:
        h = (rng.standard_normal((n, k // block)) * 0.02).astype(np.float16)
        raw[..., off : off + 2] = h.view(np.uint8).reshape(n, k // block, 2)
    if name == "MXFP4":
        raw[..., 0] = rng.integers(120, 127, size=(n, k // block))
    if name == "IQ1_M":  # its fp16 d lies in the top nibbles of the four scale words
        set_iq1m_scale(raw, (rng.standard_normal((n, k // block)) * 0.02).astype(np.float16))
    return raw.reshape(n, -1)


def set_iq1m_scale(raw: np.ndarray, d: np.ndarray) -> None:
    """Write fp16 scales d [..] into IQ1_M blocks raw [.., 56] (nibble i of d: the top
    nibble of scale word i at byte 48 + 2i)."""
    h = d.view(np.uint16).astype(np.uint16)
    for i in range(4):
        word = raw[..., 48 + 2 * i].astype(np.uint16) | (
            raw[..., 49 + 2 * i].astype(np.uint16) << 8
        )
        word = (word & 0x0FFF) | (((h >> (4 * i)) & 0xF) << 12)
        raw[..., 48 + 2 * i] = word & 0xFF
        raw[..., 49 + 2 * i] = word >> 8


def dequantized(raw: np.ndarray, name: str, n: int, k: int) -> np.ndarray:
    return np.asarray(quants.dequantize(raw, RefType[name]), dtype=np.float64).reshape(n, k)


def activations_as_used(xa: K.QuantizedRows) -> np.ndarray:
    m, k = xa.q.shape
    q = xa.q.reshape(m, k // xa.block, xa.block).double()
    return (q * xa.d.double().unsqueeze(-1)).reshape(m, k).numpy()


def quantized(x: torch.Tensor, name: str) -> K.QuantizedRows:
    """x quantized in the activation blocks type ``name`` reads (32, or 256: K-quants)."""
    return K.quantize_rows(x, K.activation_block(GGML_TYPE[name]))


def quantized_model(tmp_path: Path, arch: str, with_hf: bool = False, **over: Any) -> Any:
    """A tiny transformers ``arch`` (hidden and ffn 256) written as GGUF with its block
    matrices in a cycle of quantization types (Q8_0 where a K-quant does not fit) and loaded;
    with ``with_hf`` also the transformers model: (model, m)."""
    m = hf_model(arch, hidden_size=256, intermediate_size=256, seed=3, **over)
    kinds = [RefType[n] for n in ("Q4_K", "Q5_0", "Q8_0", "Q6_K", "Q4_0", "Q3_K", "Q5_1")]
    quant = {}
    for i, (name, t) in enumerate(gguf_tensors(m, arch).items()):
        if name.startswith("blk.") and t.dim() == 2:
            kind = kinds[i % len(kinds)]
            quant[name] = kind if t.shape[1] % 256 == 0 else RefType.Q8_0  # K-quants: 256 blocks
    model = load_model(write_gguf(tmp_path / f"{arch}.gguf", m, arch, quant))
    return (model, m) if with_hf else model


def has_vnni() -> bool:
    """Whether this CPU has AVX-512 VNNI (and VL): the native kernel build's widest ISA."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_vnni" in flags and " avx512vl" in flags


def run_python(code: str, env: dict[str, str]) -> dict:
    """``code`` run by a fresh Python at the repository root with ``env`` added (a kernel build
    of its own): its last line of output, as JSON."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=600, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
