"""Compile the C kernels of this folder once per machine and load them with ctypes.

Each ``NAME.c`` (with the folder's ``*.h``) becomes its own shared library, built with the
system C compiler for this CPU (``-march=native``) and cached under
``~/.cache/loraserve/kernels`` by a hash of the sources, the compiler and the CPU's flags,
so a later start only loads it. Plain C with ctypes, not a torch extension: gcc compiles
one file in about a second, where torch's extension headers take 30-60 s, and a cold first
start must stay within a few seconds.

OpenMP: the libraries link the ``libgomp.so.1`` that torch ships and has already loaded,
so kernels and torch share one thread pool (two pools on 2 cores slow both down).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger("loraserve.kernels")

SRC_DIR = Path(__file__).parent
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fPIC", "-shared", "-std=c11"]
# -ffp-contract=off: no fused multiply-adds the source did not ask for, so every output's
# float operations are exactly the ones written, whatever the compiler's scheduling

_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL | None] = {}
_DISABLED_ENV = "LORASERVE_NO_C_KERNELS"  # set to 1 to force the pure-torch fallbacks


def cache_dir() -> Path:
    """Where built libraries live: ``$LORASERVE_CACHE/kernels`` or ``~/.cache/loraserve``."""
    root = os.environ.get("LORASERVE_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "loraserve"
    return base / "kernels"


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


def _key(src: Path, cc: str) -> str:
    h = hashlib.sha256(src.read_bytes())
    for header in sorted(src.parent.glob("*.h")):  # the headers the sources include
        h.update(header.read_bytes())
    for part in (_cc_version(cc), _cpu_flags(), " ".join(CFLAGS), torch.__version__):
        h.update(part.encode())
    return h.hexdigest()[:16]


class _Build:
    """One compiler run into a temporary file, moved into place when it succeeds."""

    def __init__(self, src: Path, cc: str, out: Path) -> None:
        self.src, self.out = src, out
        self.tmp = tempfile.mkdtemp(dir=out.parent)
        self.tmp_out = Path(self.tmp) / out.name
        torch_lib = Path(torch.__file__).parent / "lib"
        cmd = [cc, *CFLAGS, str(src), "-o", str(self.tmp_out), f"-L{torch_lib}",
               f"-Wl,-rpath,{torch_lib}", "-lm"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def finish(self) -> bool:
        _, err = self.proc.communicate()
        try:
            if self.proc.returncode != 0:
                log.warning("compiling %s failed, using the slower pure-torch path:\n%s",
                            self.src.name, err.decode(errors="replace")[-2000:])  # fmt: skip
                return False
            os.replace(self.tmp_out, self.out)  # atomic: concurrent starts never see half
            log.info("compiled %s for this CPU (%s)", self.src.name, self.out)
            return True
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


_BUILDS: dict[str, _Build | None] = {}  # name -> compile in flight (None: nothing to build)


def _output(name: str) -> tuple[Path, Path, str] | None:
    """(source, library path, compiler) of ``NAME.c``, or None without a compiler."""
    if os.environ.get(_DISABLED_ENV) == "1":
        return None
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler found: %s kernels run on the slower pure-torch path", name)
        return None
    src = SRC_DIR / f"{name}.c"
    out = cache_dir() / f"{name}-{_key(src, cc)}.so"
    if not out.is_file():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError:  # an unwritable home: build into the temporary directory instead
            out = Path(tempfile.gettempdir()) / f"loraserve-kernels-{os.getuid()}" / out.name
            out.parent.mkdir(parents=True, exist_ok=True)
    return src, out, cc


def prebuild(names: list[str]) -> None:
    """Start compiling every listed library that is not built yet, all at once and in the
    background (a cold first start compiles while the model file is being read)."""
    with _LOCK:
        for name in names:
            if name in _LIBS or name in _BUILDS:
                continue
            where = _output(name)
            if where is None:
                _LIBS[name] = None
                continue
            src, out, cc = where
            _BUILDS[name] = None if out.is_file() else _Build(src, cc, out)


def _build(name: str) -> ctypes.CDLL | None:
    where = _output(name)
    if where is None:
        return None
    src, out, cc = where
    build = _BUILDS.pop(name, None)
    if build is None and not out.is_file():
        build = _Build(src, cc, out)
    if build is not None and not build.finish():
        return None
    return ctypes.CDLL(str(out))


def library(name: str) -> ctypes.CDLL | None:
    """The loaded library of ``NAME.c`` (built on first use), or None when it cannot be
    built here (no compiler, a build error, or ``LORASERVE_NO_C_KERNELS=1``)."""
    with _LOCK:
        if name not in _LIBS:
            _LIBS[name] = _build(name)
        return _LIBS[name]


Signature = tuple[list[type], type | None]  # (argtypes, restype) of one C function


def bind(name: str, signatures: dict[str, Signature]) -> ctypes.CDLL | None:
    """`library(name)` with each listed function's argument and result types set (once;
    later calls return the same library), or None when it cannot be built here."""
    lib = library(name)
    if lib is not None:
        for fn, (args, res) in signatures.items():
            f = getattr(lib, fn)
            f.argtypes, f.restype = args, res
    return lib
