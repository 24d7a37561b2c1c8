"""Activated LoRA (aLoRA) as llama.cpp's converter writes it: the invocation tokens and the
GGUF form of a PEFT aLoRA folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from loraserve.model.hf import hf_to_gguf_name
from tests.unit.lora.lora_util import peft_pairs

INV = [7, 8]  # the invocation sequence of the tests' aLoRA


def gguf_alora(path: Path, folder: Path) -> Path:
    """llama.cpp's converter output for an aLoRA folder (gemma3: no q/k permutation)."""
    w = GGUFWriter(str(path), "gemma3")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 8.0)
    w.add_key_value(
        "adapter.alora.invocation_tokens", INV, GGUFValueType.ARRAY, GGUFValueType.UINT32
    )
    for hf_name, (a, b) in peft_pairs(folder).items():
        name = hf_to_gguf_name(hf_name, "gemma3")
        w.add_tensor(name + ".lora_a", a.numpy().astype(np.float32))
        w.add_tensor(name + ".lora_b", b.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
