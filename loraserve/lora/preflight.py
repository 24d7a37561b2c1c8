"""Pre-flight checks of the model and adapter files from their headers only (metadata,
tensor names and shapes), before any weights load: a wrong file is reported in a second,
not after the model load. Full loading checks everything again (values included)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from loraserve.lora.adapter import AdapterError
from loraserve.lora.merge import MergeError
from loraserve.lora.merge_inputs import Shapes, peek
from loraserve.lora.validate import check_header
from loraserve.model.config import ModelConfig
from loraserve.model.validate import gguf_config


class PreflightError(ValueError):
    """A model or adapter file that cannot be served; the message names the file and why."""


def model_header(path: Path) -> tuple[ModelConfig, Shapes | None]:
    """The model's config and its weight shapes (None for a Hugging Face folder, whose
    shapes are checked at load); `PreflightError` for a file that is not a usable model."""
    if not path.exists():
        raise PreflightError(f"model not found: {path}")
    try:
        if path.is_dir():
            from loraserve.model.hf import HFCheckpoint

            return HFCheckpoint(path).config, None
        from loraserve.model.gguf import GGUFFile

        with GGUFFile(path) as gg:
            if gg.metadata.get("general.type") == "adapter":
                raise PreflightError(f"{path}: a LoRA adapter, not a model (pass it with --lora)")
            # the whole header checked: hyper-parameters against every tensor's shape
            cfg = gguf_config(path, gg.metadata, gg.tensors)
            shapes = {n: tuple(i.shape) for n, i in gg.tensors.items() if len(i.shape) in (2, 3)}
    except PreflightError:
        raise
    except (ValueError, OSError, KeyError) as e:
        said = str(e).removeprefix(f"{path}: ")  # the file's own errors name it already
        raise PreflightError(f"cannot use the model {path}: {said}") from None
    if "output.weight" not in shapes and "token_embd.weight" in shapes:
        shapes["output.weight"] = shapes["token_embd.weight"]  # tied output projection
    return cfg, shapes


def check_adapter(path: Path, cfg: ModelConfig, shapes: Shapes | None) -> None:
    """An adapter's format, architecture and target shapes against the model's header;
    `AdapterError` naming the first thing that does not fit."""
    try:
        src = peek(path, 1.0, arch_hint=cfg.arch)
    except MergeError as e:
        raise AdapterError(str(e)) from None
    if src.arch is not None and src.arch != cfg.arch:
        raise AdapterError(
            f"{path}: adapter architecture {src.arch!r} does not match the model's {cfg.arch!r}"
        )
    if not src.shapes:
        raise AdapterError(f"{path}: the adapter has no LoRA tensors")
    check_header(path, shapes)  # ranks, alpha, patterns; GGUF pairs against the base
    for target, shape in sorted(src.shapes.items()) if shapes is not None else ():
        if target not in shapes:
            raise AdapterError(f"{path}: LoRA target {target!r} does not exist in the model")
        if tuple(shape) != tuple(shapes[target]):
            raise AdapterError(
                f"{path}: LoRA for {target!r} fits a base tensor of shape {tuple(shape)}, "
                f"the model's is {tuple(shapes[target])}: an adapter for another base model"
            )


def preflight(model: Path, adapters: Sequence[str]) -> None:
    """Check the model file and every adapter against it, headers only; `PreflightError`
    naming the first file that cannot be served."""
    cfg, shapes = model_header(model)
    for a in adapters:
        try:
            check_adapter(Path(a), cfg, shapes)
        except AdapterError as e:
            raise PreflightError(f"adapter {e}") from None
