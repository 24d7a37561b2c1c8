"""Give the C heap's free pages back to the system: glibc's ``malloc_trim`` at set moments.

glibc keeps freed memory in its heaps for reuse. Once the engine frees a large mmapped
tensor (the KV pool growing, an adapter evicted), glibc raises its mmap threshold (up to
32 MiB), so the per-step temporaries below it come from the heaps, and what they free stays
mapped there: with `--cache-ram -1` the non-KV memory of the 8-adapter bench load rose from
628 MiB at start to 1,403 MiB (`bench/README.md`), where a fixed 1 MiB threshold
(``MALLOC_MMAP_THRESHOLD_``) kept it ~720 MiB lower but would mmap, fault in and zero every
temporary of 1 MiB or more on every step. ``malloc_trim(0)`` instead returns the whole free
pages inside every arena (``MADV_DONTNEED``) and leaves the allocation paths alone; the
pages a later step reuses are faulted in again then. `HeapTrim` calls it when the engine
falls idle and at most every ``every_s`` seconds while it runs (`LORASERVE_HEAP_TRIM_S`,
0: never), and `after_growth` after the KV pool has grown (the old layers freed), unless
trimming is off (`LORASERVE_HEAP_TRIM_S` 0: no trim at all, there either). No-op without
glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time

ENV = "LORASERVE_HEAP_TRIM_S"
EVERY_S = 5.0  # while the engine runs, at most one trim per this many seconds

_libc: list[ctypes.CDLL | None] = []


def _trim_fn() -> ctypes.CDLL | None:
    if not _libc:
        lib = None
        try:
            name = ctypes.util.find_library("c") or "libc.so.6"
            cand = ctypes.CDLL(name)
            if hasattr(cand, "malloc_trim"):
                cand.malloc_trim.argtypes = [ctypes.c_size_t]
                cand.malloc_trim.restype = ctypes.c_int
                lib = cand
        except OSError:
            pass
        _libc.append(lib)
    return _libc[0]


def trim() -> bool:
    """Return the heaps' free whole pages to the system now; whether any was (False
    without glibc's ``malloc_trim``)."""
    lib = _trim_fn()
    return bool(lib.malloc_trim(0)) if lib is not None else False


def after_growth() -> bool:
    """After a large free (the KV pool grown): `trim` unless `LORASERVE_HEAP_TRIM_S` turns
    trimming off (0 or less); whether any page was given back."""
    return every_s_from_env() > 0 and trim()


def every_s_from_env() -> float:
    """The period from `LORASERVE_HEAP_TRIM_S` (default `EVERY_S`; 0 or less: off)."""
    raw = os.environ.get(ENV, "")
    try:
        return float(raw) if raw.strip() else EVERY_S
    except ValueError:
        return EVERY_S


class HeapTrim:
    """When the engine thread trims: on falling idle after work, and every ``every_s``
    seconds of work (0 or less: never). ``trims`` counts the calls made."""

    def __init__(self, every_s: float | None = None) -> None:
        self.every_s = every_s_from_env() if every_s is None else every_s
        self._last = time.monotonic()
        self._dirty = False  # work ran since the last trim
        self.trims = 0

    def worked(self) -> None:
        """A step ran: trim if the last trim is ``every_s`` old."""
        if self.every_s <= 0:
            return
        self._dirty = True
        if time.monotonic() - self._last >= self.every_s:
            self._trim()

    def idle(self) -> None:
        """Nothing to run: trim once if work ran since the last trim."""
        if self._dirty and self.every_s > 0:
            self._trim()

    def _trim(self) -> None:
        trim()
        self.trims += 1
        self._dirty = False
        self._last = time.monotonic()
