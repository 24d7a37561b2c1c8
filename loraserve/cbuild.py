"""Compile the C kernels (``loraserve/kernels/*.c``) once per machine (at install with
`loraserve build-kernels`, else on first use) and load them with ctypes.

This module imports no torch, so the command line starts the compile before anything heavy
is imported (a cold first start overlaps it with torch's import and the model's parsing).

The folder's ``*.c`` files (with its ``*.h``) become one shared library, built with the
system C compiler for this CPU (``-march=native``) and cached under
``~/.cache/loraserve/kernels`` by a hash of the sources, the compiler and the CPU's flags,
so a later start only loads it. ``loraserve build-kernels`` (the README's install step)
builds it into the package itself (``loraserve/kernels/_build``), where every user's first
start finds it: on 2 cores the compile's ~4 s of CPU otherwise share a cold start with
torch's import. Plain C with ctypes, not a torch extension: gcc compiles
them as two units in parallel in about 2 s, where torch's extension headers take 30-60 s,
and a cold first start must stay within a few seconds.

OpenMP: the libraries link the ``libgomp.so.1`` that torch ships and has already loaded,
so kernels and torch share one thread pool (two pools on 2 cores slow both down).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from loraserve.cbuild_compile import Build
from loraserve.cbuild_env import (  # noqa: F401  (re-exported: the build's public names)
    CFLAGS,
    SRC_DIR,
    _cc_version,
    _compiler,
    _cpu_flags,
    _torch_version,
    cache_dir,
    cflags,
    prebuilt_dir,
    trust,
)

log = logging.getLogger("loraserve.kernels")
_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL | None] = {}
_DISABLED_ENV = "LORASERVE_NO_C_KERNELS"  # set to 1 to force the pure-torch fallbacks


LIBRARY = "kernels"  # one shared library of every source below
# compiled as two units in parallel, each including its sources, then linked once, so the
# fused layers (layers.c) call the very functions the Python wrappers call. Two units, not
# six: every file parses the intrinsics headers (~0.3 s of CPU each), and a cold first start
# waits for this build (measured on 2 cores: six objects 2.95 s, these two 2.2 s)
UNITS = (
    (
        "qmatmul.c",
        "quantize.c",
        "moe.c",
        "ssm_scan.c",
        "ssd_chunk.c",
        "mamba2_step.c",
        "embed_rows.c",
    ),
    (
        "packed.c",
        "floatmm.c",
        "lora16.c",
        "rowops.c",
        "logits_scan.c",
        "attention.c",
        "layers.c",
        "deltanet.c",
        "gdn_chunk.c",
    ),
)


def _key(cc: str) -> str:
    h = hashlib.sha256()
    for f in sorted(SRC_DIR.glob("*.[ch]")):  # every source and header of the folder
        h.update(f.name.encode())
        h.update(f.read_bytes())
    flags = " ".join(cflags() + [repr(UNITS)])
    for part in (_cc_version(cc), _cpu_flags(), flags, _torch_version()):
        h.update(part.encode())
    return h.hexdigest()[:16]


_BUILD: list[Build] = []  # the compile in flight, if any


def _output(prebuilt: bool = True) -> tuple[Path, str] | None:
    """(library path, compiler), or None without a compiler, with the kernels disabled, or
    no private directory to build in (`trust.private_dir`). The package's prebuilt library
    when it is there with its hash (and ``prebuilt``), else the user's cache."""
    if os.environ.get(_DISABLED_ENV) == "1":
        return None
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler found: the kernels run on the slower pure-torch path")
        return None
    name = f"{LIBRARY}-{_key(cc)}.so"
    if prebuilt and trust.recorded(prebuilt_dir() / name) and trust.trusted_dir(prebuilt_dir()):
        return prebuilt_dir() / name, cc
    try:
        out = trust.private_dir(cache_dir()) / name
    except OSError:  # an unwritable home: build into the temporary directory instead
        try:
            out = (
                trust.private_dir(Path(tempfile.gettempdir()) / f"loraserve-kernels-{os.getuid()}")
                / name
            )
        except (OSError, trust.UntrustedPath) as e:
            log.warning("C kernels not built: %s; the kernels run on the slower pure-torch path", e)
            return None
    except trust.UntrustedPath as e:
        log.warning("C kernels not built: %s; the kernels run on the slower pure-torch path", e)
        return None
    return out, cc


def prebuild() -> None:
    """Start compiling the library if it is not built yet, in the background (a cold first
    start compiles while the model file is being read)."""
    with _LOCK:
        if LIBRARY in _LIBS or _BUILD:
            return
        where = _output()
        if where is None:
            _LIBS[LIBRARY] = None
        elif not where[0].is_file():
            _BUILD.append(Build(where[1], where[0], UNITS))


def _build() -> ctypes.CDLL | None:
    where = _output()
    if where is None:
        return None
    out, cc = where
    if out.parent == prebuilt_dir():
        try:
            return _load(out, prebuilt=True)
        except trust.UntrustedPath as e:
            log.warning("the prebuilt C kernels are not loaded: %s", e)
        where = _output(prebuilt=False)
        if where is None:
            return None
        out, cc = where
    build = _BUILD.pop() if _BUILD else None
    if build is None and not out.is_file():
        build = Build(cc, out, UNITS)
    if build is not None and not build.finish():
        return None
    try:
        return _load(out, prebuilt=False)
    except trust.UntrustedPath as e:
        log.warning("rebuilding the C kernels: %s", e)  # our own private folder
    if not Build(cc, out, UNITS).finish():
        return None
    try:
        return _load(out, prebuilt=False)
    except trust.UntrustedPath as e:
        log.warning("C kernels not loaded: %s", e)
        return None


def _load(lib: Path, prebuilt: bool) -> ctypes.CDLL:
    """The library at ``lib``, loaded only once `trust.open_verified` accepts it."""
    path, fd = trust.open_verified(lib, allow_root=prebuilt)
    try:
        return ctypes.CDLL(path)
    finally:
        os.close(fd)


def build_into_package() -> Path | None:
    """Build the library into `prebuilt_dir` (install time); its path, or None when this
    machine cannot build it (no compiler, a build error, kernels disabled)."""
    cc = _compiler()
    if cc is None or os.environ.get(_DISABLED_ENV) == "1":
        return None
    out = prebuilt_dir() / f"{LIBRARY}-{_key(cc)}.so"
    if not trust.recorded(out):
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            probe = out.parent / f".probe-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError:  # a read-only install: the user cache, as a first start would
            log.warning("%s is not writable: building into %s", out.parent, cache_dir())
            where = _output() if library() is not None else None
            return None if where is None else where[0]
        if not Build(cc, out, UNITS).finish():
            return None
    return out


def library() -> ctypes.CDLL | None:
    """The loaded kernel library (built on first use), or None when it cannot be built
    here (no compiler, a build error, or ``LORASERVE_NO_C_KERNELS=1``)."""
    with _LOCK:
        if LIBRARY not in _LIBS:
            _LIBS[LIBRARY] = _build()
        return _LIBS[LIBRARY]


Signature = tuple[list[type], type | None]  # (argtypes, restype) of one C function


def lazy_bind(signatures: dict[str, Signature]) -> Callable[[], ctypes.CDLL | None]:
    """A function that `bind`s ``signatures`` on its first call (building the library then,
    not at import) and returns the same result on every later call."""
    bound: list[ctypes.CDLL | None] = []

    def get() -> ctypes.CDLL | None:
        if not bound:
            bound.append(bind(signatures))
        return bound[0]

    return get


def bind(signatures: dict[str, Signature]) -> ctypes.CDLL | None:
    """`library()` with each listed function's argument and result types set, or None
    when it cannot be built here."""
    lib = library()
    if lib is not None:
        for fn, (args, res) in signatures.items():
            f = getattr(lib, fn)
            f.argtypes, f.restype = args, res
    return lib
