"""Inputs of `loraserve merge`: each adapter's format, architecture and base shapes read
from its headers, and the checks that they all fit one base model."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from loraserve.lora.adapter import _PEFT_KEY, Adapter, _module_key
from loraserve.lora.adapter_write import ARCH_KEY
from loraserve.lora.merge import MergeError
from loraserve.model.config import ModelConfig
from loraserve.model.hf import hf_to_gguf_name

Shapes = dict[str, tuple[int, ...]]
_QK = (".attn_q.weight", ".attn_k.weight")


@dataclass
class Source:
    """One input: where it is, its weight and what its headers say."""

    path: Path
    weight: float
    fmt: str  # "gguf" or "peft"
    arch: str | None  # None: a PEFT folder that does not record it
    shapes: Shapes  # target -> base shape (out, in) or (E, out, in), from the pairs' shapes
    base_model: str | None = None
    adapter: Adapter | None = None


def parse_spec(spec: str) -> tuple[Path, float]:
    """``path[:weight]`` -> (path, weight); the weight defaults to 1."""
    path, sep, tail = spec.rpartition(":")
    if not sep or Path(spec).exists():
        return Path(spec), 1.0
    try:
        weight = float(tail)
    except ValueError:
        raise MergeError(f"{spec!r}: the weight after ':' must be a number, got {tail!r}") from None
    if not math.isfinite(weight):
        raise MergeError(f"{spec!r}: the weight must be finite")
    return Path(path), weight


def peek(path: Path, weight: float, arch_hint: str | None = None) -> Source:
    """Format, architecture and base shapes of an input, from its headers only
    (`arch_hint`: the architecture to map a PEFT folder's names with when it records none)."""
    if not path.exists():
        raise MergeError(f"{path}: no such adapter file or folder")
    if path.is_dir():
        return _peek_peft(path, weight, arch_hint)
    from loraserve.model.gguf import GGUFFile

    try:
        with GGUFFile(path) as gg:
            meta, infos = gg.metadata, gg.tensors
    except (ValueError, OSError) as e:
        raise MergeError(f"{path}: not a GGUF LoRA file or PEFT folder ({e})") from None
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise MergeError(f"{path}: a GGUF file but not a LoRA adapter (general.type, adapter.type)")
    shapes: Shapes = {}
    for name, info in infos.items():
        base, _, part = name.rpartition(".")
        if part in ("lora_a", "lora_b"):
            old = shapes.get(base, (*info.shape[:-2], 0, 0))
            dims = (info.shape[-2], old[-1]) if part == "lora_b" else (old[-2], info.shape[-1])
            shapes[base] = (*info.shape[:-2], *dims)
    arch = meta.get("general.architecture")
    return Source(path, weight, "gguf", str(arch) if arch else None, shapes)


def _peek_peft(path: Path, weight: float, arch_hint: str | None = None) -> Source:
    from safetensors import safe_open

    try:
        conf = json.loads((path / "adapter_config.json").read_text())
        with safe_open(str(path / "adapter_model.safetensors"), "pt") as st:
            dims = {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
            arch = (st.metadata() or {}).get(ARCH_KEY)
    except Exception as e:  # missing files, bad JSON, corrupt safetensors
        raise MergeError(f"{path}: not a readable PEFT adapter folder ({e})") from None
    if not isinstance(conf, dict):
        raise MergeError(f"{path}/adapter_config.json: not a JSON object")
    shapes: Shapes = {}
    for key, shape in dims.items():
        m = _PEFT_KEY.match(key)
        target = m and hf_to_gguf_name(
            _module_key(m.group(1)) + ".weight", arch or arch_hint or "llama"
        )
        if m and target and m.group(2) in ("lora_A", "lora_B"):
            old = shapes.get(target, (0, 0))
            shapes[target] = (shape[0], old[1]) if m.group(2) == "lora_B" else (old[0], shape[1])
    return Source(path, weight, "peft", arch, shapes, conf.get("base_model_name_or_path"))


def _model_info(path: Path) -> tuple[ModelConfig, Shapes]:
    if path.is_file():
        from loraserve.model.gguf import GGUFFile

        with GGUFFile(path) as gg:
            cfg = ModelConfig.from_gguf(gg.metadata, set(gg.tensors))
            shapes = {n: tuple(i.shape) for n, i in gg.tensors.items() if len(i.shape) in (2, 3)}
        if "output.weight" not in shapes and "token_embd.weight" in shapes:
            shapes["output.weight"] = shapes["token_embd.weight"]
        return cfg, shapes
    from loraserve.lora.registry import base_shapes
    from loraserve.model.loader import load_model

    model = load_model(path)
    return model.config, base_shapes(model.decoder)


def resolve(args: argparse.Namespace, sources: list[Source]) -> tuple[ModelConfig, Shapes]:
    """The config to load the inputs with and the base shapes they must fit."""
    cfg, shapes = _model_info(args.model) if args.model else (None, {})
    named = {str(s.path): s.arch for s in sources if s.arch}
    named |= {"--model": cfg.arch} if cfg else {}
    named |= {"--arch": args.arch} if args.arch else {}
    if len(set(named.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in named.items())
        raise MergeError(f"the inputs are for different base architectures ({listed})")
    arch = next(iter(named.values()), None)
    if arch is None and args.format == "gguf":
        raise MergeError(
            "the base architecture is unknown (PEFT folders do not record it): "
            "pass --arch NAME or --model PATH"
        )
    seen: dict[str, tuple[tuple[int, ...], Path]] = {}
    for s in sources:
        for t, shp in s.shapes.items():
            if t in seen and seen[t][0] != shp:
                raise MergeError(
                    f"{t}: {seen[t][1]} fits a base tensor of shape {seen[t][0]} but {s.path} "
                    f"one of {shp}: the adapters are for different base models"
                )
            seen.setdefault(t, (shp, s.path))
    if cfg is not None:
        return cfg, shapes
    formats = {s.fmt for s in sources} | {args.format}
    if arch == "llama" and len(formats) > 1 and any(t.endswith(_QK) for t in seen):
        raise MergeError(
            "llama q/k LoRA rows are permuted in GGUF files and not in PEFT "
            "folders; converting between them needs the head counts: pass --model"
        )
    try:
        cfg = ModelConfig(arch or "llama", 0, 0, 0, 1, 1, 1, 0, 0.0, 0.0, 0)
    except ValueError as e:
        raise MergeError(f"base architecture: {e}") from None
    return cfg, {t: shp for t, (shp, _) in seen.items()}
