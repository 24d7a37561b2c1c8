"""The model files a router lists besides its presets: llama-server's `--models-dir` scan,
and the default model where its package is installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def models_dir_entries(folder: str) -> dict[str, str]:
    """llama-server's `--models-dir` scan: `NAME.gguf` files, and folders holding a model
    (`mmproj*` and draft sidecars left out, a split model's first shard): name -> path."""

    def is_companion(name: str) -> bool:
        return name.startswith("mmproj") or "draft" in name.lower()

    out: dict[str, str] = {}
    for entry in sorted(Path(folder).iterdir()):
        if entry.is_dir():
            files = sorted(p for p in entry.glob("*.gguf") if not is_companion(p.name))
            shard = [p for p in files if "-00001-of-" in p.name]
            if files:
                out[entry.name] = str((shard or files)[-1])
        elif entry.name.endswith(".gguf") and not is_companion(entry.name):
            out[entry.name.removesuffix(".gguf")] = str(entry)
    return out


def default_model_entry() -> tuple[str, str] | None:
    """The default model (its package installed) as the router's one cached model, listed
    as llama-server lists its download cache: (name, path; assembled when first loaded)."""
    from loraserve.model.default import FILE_NAME, cache_dir
    from loraserve.server.startup import DEFAULT_MODEL_PACKAGE

    if importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is None:
        return None
    return FILE_NAME.removesuffix(".gguf"), str(cache_dir() / FILE_NAME)
