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


def _key(src: Path, cc: str) -> str:
    h = hashlib.sha256(src.read_bytes())
    for header in sorted(src.parent.glob("*.h")):  # the headers the sources include
        h.update(header.read_bytes())
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    for part in (ver, _cpu_flags(), " ".join(CFLAGS), torch.__version__):
        h.update(part.encode())
    return h.hexdigest()[:16]


def _build(name: str) -> ctypes.CDLL | None:
    if os.environ.get(_DISABLED_ENV) == "1":
        return None
    src = SRC_DIR / f"{name}.c"
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler found: %s kernels run on the slower pure-torch path", name)
        return None
    out = cache_dir() / f"{name}-{_key(src, cc)}.so"
    if not out.is_file():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError:  # an unwritable home: build into the temporary directory instead
            out = Path(tempfile.gettempdir()) / f"loraserve-kernels-{os.getuid()}" / out.name
            out.parent.mkdir(parents=True, exist_ok=True)
        torch_lib = Path(torch.__file__).parent / "lib"
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            cmd = [cc, *CFLAGS, str(src), "-o", str(tmp_out), f"-L{torch_lib}",
                   f"-Wl,-rpath,{torch_lib}", "-lm"]  # fmt: skip
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                log.warning(
                    "compiling %s failed, using the slower pure-torch path:\n%s",
                    src.name,
                    r.stderr[-2000:],
                )
                return None
            os.replace(tmp_out, out)  # atomic: concurrent first starts never see half a file
        log.info("compiled %s for this CPU (%s)", src.name, out)
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
