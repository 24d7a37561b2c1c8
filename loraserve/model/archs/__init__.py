"""Architectures: one short declarative file each, found here by name.

Each module of this package defines ``ARCH``, an `Arch`: its llama.cpp name (the GGUF
``general.architecture``), the Hugging Face ``model_type`` names it reads, its layer kinds and
flags (rope layout, q/k norms, biases, norm placement, activation, experts) and a hook that reads
its own GGUF hyper-parameter keys (``<arch>.*``) into `ModelConfig` fields, as llama.cpp's
``src/models/<arch>.cpp`` does in ``load_arch_hparams``. The tensors are named as llama.cpp's
``src/llama-arch.cpp`` names them (`TENSORS`); which of them a layer has follows from its kinds.

`ModelConfig.from_gguf` / `from_hf` look the architecture up here (`get`); any other name is
refused with one line naming it and the supported list. Adding an architecture is adding its
file (and its test data under ``tests/data/archs/``).
"""

from __future__ import annotations

import importlib
import pkgutil

from loraserve.model.archs.base import TENSORS, Arch, Keys, UnsupportedModelError

__all__ = ["ARCHS", "TENSORS", "Arch", "Keys", "UnsupportedModelError", "get", "supported"]


def _discover() -> dict[str, Arch]:
    found: dict[str, Arch] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "base":
            continue
        arch = getattr(importlib.import_module(f"{__name__}.{info.name}"), "ARCH", None)
        if isinstance(arch, Arch):
            found[arch.name] = arch
    return found


ARCHS: dict[str, Arch] = _discover()


def supported() -> tuple[str, ...]:
    """The architecture names loraserve runs, sorted."""
    return tuple(sorted(ARCHS))


def get(name: str) -> Arch:
    """The architecture called ``name`` (GGUF ``general.architecture``), or a one-line refusal
    naming it and the supported list."""
    arch = ARCHS.get(name)
    if arch is None:
        raise UnsupportedModelError(
            f"unsupported architecture {name!r}; supported: {', '.join(supported())}"
        )
    return arch


def by_hf_type(model_type: str) -> Arch:
    """The architecture that reads a Hugging Face ``model_type``, or a one-line refusal."""
    for arch in ARCHS.values():
        if model_type in arch.hf_types:
            return arch
    raise UnsupportedModelError(
        f"unsupported model_type {model_type!r}; supported architectures: {', '.join(supported())}"
    )
