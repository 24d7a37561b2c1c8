"""A GGUF LoRA file's pairs as views of its mapping, checked in a few passes.

`lora.adapter` turns each pair into what it holds (the file's halves, or float32) with one
copy of each tensor, and hashes the values as they are stored, while the file is mapped:
the float16 and float32 tensors are read here as views of the mapping (no copy), BF16 ones
straight to float32 (one pass; exact), other types through `GGUFFile.tensor`. Whether
every value is finite is asked once per run of same-typed tensors lying back to back in
the file (a file's data is one run: one reduction instead of one a tensor, which cost more
than the copies); only a run that fails is looked at tensor by tensor, by the caller.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loraserve.kernels import lora16
from loraserve.lora.adapter_gguf import AdapterGGUF
from loraserve.model.config import ModelConfig
from loraserve.model.gguf import GGUFFile, GGUFTensorInfo
from loraserve.model.loader import unpermute_qk

F32, F16, BF16 = 0, 1, 30
_VIEWED = {F32: np.float32, F16: np.float16}

# target -> (A, B, factor, whether the file stored both as float16, whether a tensor may
# be a view of the file's mapping: the caller copies before holding it)
Pairs = dict[str, tuple[torch.Tensor, torch.Tensor, float, bool, bool]]


def open_gguf(path: Path) -> GGUFFile:
    """The file mapped and its header parsed; `AdapterError` naming why not."""
    from loraserve.lora.adapter import AdapterError

    try:
        return AdapterGGUF(path)
    except (ValueError, OSError) as e:
        raise AdapterError(f"cannot read GGUF LoRA {path}: {e}") from None


def read_gguf(
    gg: GGUFFile, path: Path, cfg: ModelConfig, base_shapes: dict[str, tuple[int, ...]] | None
) -> tuple[str, dict[str, Any], Pairs, bool]:
    """(name, metadata, pairs, all values finite) of an open GGUF LoRA file; the pairs are
    valid while ``gg``'s mapping is. `AdapterError` for anything that does not fit."""
    from loraserve.lora.adapter import AdapterError
    from loraserve.lora.validate import check_alpha, gguf_pairs

    meta = gg.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise AdapterError(
            f"{path}: not a LoRA adapter (general.type={meta.get('general.type')!r}, "
            f"adapter.type={meta.get('adapter.type')!r})"
        )
    arch = meta.get("general.architecture")
    if arch != cfg.arch:
        raise AdapterError(
            f"{path}: adapter architecture {arch!r} does not match the model's {cfg.arch!r}"
        )
    # every pair's ranks and shapes against the base before any tensor is read
    gguf_pairs(path, {n: i.shape for n, i in gg.tensors.items()}, base_shapes)
    alpha = check_alpha(path, meta.get("adapter.lora.alpha", 0.0))
    halves: dict[str, dict[str, torch.Tensor]] = {}
    wide: set[str] = set()  # pairs with a tensor not stored as float16
    used: list[tuple[str, GGUFTensorInfo]] = []
    with warnings.catch_warnings():  # read-only mapping; the bytes are only ever read
        warnings.simplefilter("ignore", UserWarning)
        for tname, info in gg.tensors.items():
            base, _, part = tname.rpartition(".")
            if part not in ("lora_a", "lora_b"):
                continue  # norm vectors: llama.cpp ignores them (gguf_pairs refused the rest)
            try:
                halves.setdefault(base, {})[part] = _tensor(gg, info)
            except ValueError as e:
                raise AdapterError(f"{path}: tensor {tname!r}: {e}") from None
            if info.ggml_type != F16:
                wide.add(base)
            used.append((base, info))
    pairs: Pairs = {}
    for base, ab in halves.items():
        a, b = ab["lora_a"], ab["lora_b"]
        if cfg.permuted_qk and base.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = cfg.n_heads if ".attn_q." in base else cfg.n_kv_heads
            if b.dim() == 2 and b.shape[0] % (2 * heads) == 0:
                b = unpermute_qk(b, heads)  # the converter permuted B's rows as the base's
        rank = b.shape[-1]
        pairs[base] = (a, b, alpha / rank if alpha else 1.0, base not in wide, True)
    name = str(meta.get("general.name") or path.stem)
    # the pairs `lora16.hold` copies are checked there, in the same pass as the copy
    rest = [i for base, i in used if base in wide or len(i.shape) != 2 or not lora16.available()]
    return name, dict(meta), pairs, runs_finite(gg, rest)


def _tensor(gg: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    """F16 and F32 as read-only views of the mapping (never written, copied before they
    are held), BF16 widened to float32 in one pass, any other type dequantized (the
    caller ignores the read-only warning)."""
    if info.ggml_type in _VIEWED:
        return torch.from_numpy(gg.raw(info.name).view(_VIEWED[info.ggml_type]).reshape(info.shape))
    if info.ggml_type == BF16:
        raw = torch.from_numpy(gg.raw(info.name).view(np.int16).reshape(info.shape))
        return raw.view(torch.bfloat16).float()
    return gg.tensor(info.name)


def runs_finite(gg: GGUFFile, infos: list[GGUFTensorInfo]) -> bool:
    """Whether every value of these tensors is finite, asked once per run of tensors of
    one float type that follow each other in the file (the padding between two, zeros
    in a well-formed file, is read with them: a non-finite pad only sends the caller to
    the tensor-by-tensor check). Quantized tensors are checked after decoding (False)."""
    runs: list[tuple[int, int, int]] = []  # (type, start, end) in file offsets
    for info in sorted(infos, key=lambda i: i.offset):
        if info.ggml_type not in _BITS:
            return False
        if runs and runs[-1][0] == info.ggml_type and info.offset - runs[-1][2] < gg.alignment:
            runs[-1] = (info.ggml_type, runs[-1][1], info.offset + info.nbytes)
        else:
            runs.append((info.ggml_type, info.offset, info.offset + info.nbytes))
    if not runs:
        return True
    data = gg.raw(infos[0].name).base  # the whole file's bytes (`GGUFFile.raw` slices it)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        return False
    for ggml_type, start, end in runs:
        bits = _BITS[ggml_type][0]
        size = np.dtype(bits).itemsize
        if not finite_bits(data[start : end - (end - start) % size].view(bits), ggml_type):
            return False
    return True


# ggml type -> (the unsigned integer of its width, the exponent bits: a value whose bits
# but the sign reach them is an infinity or a NaN)
_BITS = {F32: (np.uint32, 0x7F800000), F16: (np.uint16, 0x7C00), BF16: (np.uint16, 0x7F80)}
_TORCH_TYPES = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}


def finite_bits(bits: np.ndarray, ggml_type: int) -> bool:
    """Whether every value is finite, from its bits (``bits``: the values viewed as the
    unsigned integers of `_BITS`): two numpy passes on one thread (a torch reduction of a
    whole file would take the intra-op threads beside the engine's)."""
    if bits.size == 0:
        return True
    magnitude = np.iinfo(bits.dtype).max >> 1  # every bit but the sign
    return int((bits & magnitude).max()) < _BITS[ggml_type][1]


def tensors_finite(ts: list[torch.Tensor]) -> bool:
    """Whether every value of these float32, float16 or BF16 tensors is finite, one check
    per type over their values gathered (False for another type: checked one by one)."""
    groups: dict[int, list[np.ndarray]] = {}
    for t in ts:
        ggml_type = _TORCH_TYPES.get(t.dtype)
        if ggml_type is None:
            return False
        ints = torch.int32 if ggml_type == F32 else torch.int16
        flat = t.detach().contiguous().view(ints).numpy().reshape(-1)
        groups.setdefault(ggml_type, []).append(flat.view(_BITS[ggml_type][0]))
    return all(finite_bits(np.concatenate(g), k) for k, g in groups.items())
