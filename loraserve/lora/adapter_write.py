"""Write LoRA adapters as llama.cpp GGUF LoRA files or PEFT folders, atomically.

Both writers take pairs in Hugging Face layout (``A`` [r, in], ``B`` [out, r], factor 1:
``ΔW = B A`` at scale 1), keyed by GGUF base tensor name, as `load_adapter` returns them.
Ranks may differ per target: GGUF stores ``adapter.lora.alpha = 0``, which llama.cpp (and
`load_adapter`) read as "the scale alone"; PEFT gets ``lora_alpha = r`` and matching
``rank_pattern``/``alpha_pattern`` entries.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loraserve.model.gguf_write import write_gguf
from loraserve.model.hf import HF_MODULE_TO_GGUF, hf_to_gguf_name
from loraserve.model.loader import permute_qk

Pairs = Mapping[str, tuple[torch.Tensor, torch.Tensor]]  # target -> (A [.., r, in], B [.., out, r])
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")
_GGUF_TO_HF = {v: k for k, v in HF_MODULE_TO_GGUF.items()}
ARCH_KEY = "loraserve.base_architecture"  # in a PEFT folder's safetensors metadata


def check_output(path: Path, fmt: str) -> None:
    """ValueError naming why ``path`` cannot receive a ``fmt`` ("gguf"/"peft") adapter."""
    if not path.parent.is_dir():
        raise ValueError(f"{path}: the folder {path.parent} does not exist")
    if fmt == "gguf" and path.is_dir():
        raise ValueError(f"{path} is a folder; a GGUF output must be a file path")
    if fmt == "peft" and path.exists() and not _replaceable(path):
        raise ValueError(f"{path} exists and is not a PEFT adapter folder; not overwriting it")


def write_adapter(
    path: Path,
    fmt: str,
    pairs: Pairs,
    record: Mapping[str, Any],
    *,
    arch: str | None,
    qk_heads: tuple[int, int] = (1, 1),
    base_model: str | None = None,
) -> Path:
    """Write ``pairs`` as a GGUF LoRA (``fmt="gguf"``, ``arch`` required) or a PEFT folder,
    with ``record`` (JSON-able) as ``loraserve.merge.*`` GGUF metadata or as a JSON string
    under ``loraserve.merge`` in the safetensors header (with ``ARCH_KEY`` when known)."""
    if fmt == "gguf":
        if arch is None:
            raise ValueError("a GGUF adapter needs the base architecture")
        meta = {f"loraserve.merge.{k}": v for k, v in record.items()}
        if "weights" in record:
            meta["loraserve.merge.weights"] = np.array(record["weights"], np.float64)
        return write_gguf_lora(path, arch, pairs, meta, qk_heads)
    header = {"loraserve.merge": json.dumps(dict(record))} | ({ARCH_KEY: arch} if arch else {})
    extra = {"base_model_name_or_path": base_model}
    return write_peft_folder(path, arch or "llama", pairs, extra, header)


def write_gguf_lora(
    path: str | os.PathLike[str],
    arch: str,
    pairs: Pairs,
    metadata: Mapping[str, Any] | None = None,
    qk_heads: tuple[int, int] = (1, 1),
) -> Path:
    """Write a GGUF LoRA (``general.type=adapter``, ``adapter.type=lora``, alpha 0).

    Tensors keep their dtype (float32 -> F32, float16 -> F16). For a llama base, the rows of
    ``attn_q``/``attn_k`` B are permuted as llama.cpp's converter does, with ``qk_heads`` =
    (n_heads, n_kv_heads); `load_adapter` undoes it with the same counts.
    """
    path = Path(path)
    meta: dict[str, Any] = {
        "general.architecture": arch,
        "general.type": "adapter",
        "general.name": path.stem,
        "adapter.type": "lora",
        "adapter.lora.alpha": 0.0,
        **(metadata or {}),
    }
    tensors: dict[str, torch.Tensor] = {}
    for target in sorted(pairs):
        a, b = pairs[target]
        if arch == "llama" and target.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = qk_heads[0] if ".attn_q." in target else qk_heads[1]
            if b.dim() == 2 and b.shape[0] % (2 * heads) == 0:
                b = permute_qk(b, heads)
        tensors[f"{target}.lora_a"], tensors[f"{target}.lora_b"] = a.contiguous(), b.contiguous()
    return write_gguf(path, meta, tensors)


def peft_module(target: str, arch: str) -> str:
    """GGUF base tensor name -> the HF module PEFT wraps (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj``); ValueError when PEFT cannot address it."""
    if target == "output.weight":
        return "lm_head"
    m = _BLOCK.match(target)
    short = _GGUF_TO_HF.get(m.group(2)) if m else None
    if m and short:
        for parent in ("self_attn", "mlp", "block_sparse_moe"):
            module = f"model.layers.{m.group(1)}.{parent}.{short}"
            if hf_to_gguf_name(module + ".weight", arch) == target:
                return module
    raise ValueError(f"{target!r} has no PEFT module name (stacked experts need GGUF output)")


def write_peft_folder(
    path: str | os.PathLike[str],
    arch: str,
    pairs: Pairs,
    config_extra: Mapping[str, Any] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` into folder ``path``.

    ``config_extra`` adds keys PEFT knows to the config (PEFT warns about unknown ones);
    ``metadata`` goes into the safetensors header, where PEFT ignores it. The folder is built
    beside ``path`` and renamed into place; an existing ``path`` must be an empty folder or a
    PEFT adapter folder (it is replaced).
    """
    from safetensors.torch import save_file

    path = Path(path)
    if path.exists() and not _replaceable(path):
        raise ValueError(f"{path} exists and is not a PEFT adapter folder; not overwriting it")
    modules = {t: peft_module(t, arch) for t in pairs}
    ranks = {modules[t]: pairs[t][0].shape[-2] for t in pairs}
    r = Counter(ranks.values()).most_common(1)[0][0]
    pattern = {_pattern(m): k for m, k in sorted(ranks.items()) if k != r}
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": r,
        "lora_alpha": r,
        "rank_pattern": pattern,
        "alpha_pattern": dict(pattern),
        "target_modules": _target_modules(list(modules.values())),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        **(config_extra or {}),
    }
    tensors = {}
    for t, (a, b) in pairs.items():
        key = f"base_model.model.{modules[t]}"
        tensors[f"{key}.lora_A.weight"] = a.contiguous()
        tensors[f"{key}.lora_B.weight"] = b.contiguous()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    old = tmp.with_suffix(".old")
    try:
        tmp.mkdir()
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(
            tensors,
            str(tmp / "adapter_model.safetensors"),
            metadata={"format": "pt", **(metadata or {})},
        )
        if path.exists():
            path.rename(old)
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not path.exists():
            old.rename(path)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return path


def _replaceable(path: Path) -> bool:
    return path.is_dir() and (not any(path.iterdir()) or (path / "adapter_config.json").is_file())


def _pattern(module: str) -> str:
    """A PEFT pattern matching exactly this module (with or without a wrapper prefix)."""
    return re.escape(module.removeprefix("model."))


def _target_modules(modules: list[str]) -> list[str]:
    """Short names when the targets are every short name seen in every layer seen, else the
    module names without their ``model.`` prefix (PEFT matches a suffix)."""
    layered = [m for m in modules if m.startswith("model.layers.")]
    layers = {m.split(".")[2] for m in layered}
    shorts = {m.rpartition(".")[2] for m in layered}
    if len(layered) == len(layers) * len(shorts):
        return sorted(shorts | (set(modules) - set(layered)))
    return sorted(m.removeprefix("model.") for m in modules)
