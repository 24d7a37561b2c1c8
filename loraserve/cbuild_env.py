"""Where the C kernels are built and what identifies a build: the source folder, the
prebuilt and cache folders, the compiler, this CPU's flags, the compiler flags (``cflags``) and
torch's version. Imports no torch (`loraserve.cbuild` runs before torch is imported)."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

SRC_DIR = Path(__file__).parent / "kernels"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fPIC", "-shared", "-std=c11"]
# -ffp-contract=off: no fused multiply-adds the source did not ask for, so every output's
# float operations are exactly the ones written, whatever the compiler's scheduling
_NO_AVX512_ENV = "LORASERVE_KERNEL_NO_AVX512"  # 1: build for this CPU without AVX-512 (the
# AVX2 paths, to compare their bits with the AVX-512 VNNI ones on a machine that has both)


def cflags() -> list[str]:
    """The compiler flags of this process's build: `CFLAGS`, with ``-mno-avx512f`` (every
    AVX-512 extension off) under ``LORASERVE_KERNEL_NO_AVX512=1``."""
    return CFLAGS + (["-mno-avx512f"] if os.environ.get(_NO_AVX512_ENV) == "1" else [])


def _load_trust():  # type: ignore[no-untyped-def]
    """`loraserve/kernels/trust.py`, loaded without the kernels package (which imports
    torch: this module must not)."""
    name = "loraserve.kernels.trust"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SRC_DIR / "trust.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


trust = _load_trust()


def prebuilt_dir() -> Path:
    """Where ``loraserve build-kernels`` puts the library: the package's own folder
    (``$LORASERVE_PREBUILT_DIR`` overrides it)."""
    root = os.environ.get("LORASERVE_PREBUILT_DIR")
    return Path(root).expanduser() if root else SRC_DIR / "_build"


def cache_dir() -> Path:
    """Where built libraries live: ``$LORASERVE_CACHE/kernels`` or ``~/.cache/loraserve``."""
    root = os.environ.get("LORASERVE_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "loraserve"
    return base / "kernels"


@functools.cache
def _torch_dir() -> Path:
    """torch's package folder, found without importing torch (its import takes 1-2 s)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return (_torch_dir() / "version.py").read_text()


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc) or shutil.which("gcc")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


@functools.cache
def _cc_version(cc: str) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
