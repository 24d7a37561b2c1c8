"""Content ids of adapter files read before, so that a re-read of an unchanged file (an
adapter evicted from memory and used again) skips hashing its values.

An adapter's content id (`lora.adapter`: BLAKE3 of its targets' names, shapes, factors
and values) keys its KV in the prefix cache, so it must change whenever the values do.
It costs ~0.6-1 ms of a ~3.5-4.5 ms read of a 3.8-7.6 MB float16 adapter (thread CPU
time; BLAKE3 runs at ~6-9 GB/s here, sha256 at ~2). `ContentIds` keeps, per file, the id
last computed under the file's identity: real path, device, inode, size, and
modification and status-change times in nanoseconds (a PEFT folder: both of its files).
Any write to a file sets its status-change time to the present, and no call can set it
back, so a file whose content changed has another identity, even when its size is the
same and its modification time was restored. Two guards close the gaps that leaves:

- an id is remembered only for a file whose times are older than `MARGIN_NS` when the
  read started (a write within the same tick of the file system's clock as an earlier one
  could leave the times equal; git's "racy" index entries, the same answer), and only when
  the identity after the read is the one before it (no write during the read);
- a remembered id is used only when the identity after the read (its values copied) is
  still the one it was stored under; else the values just read are hashed.

A write through a shared mapping of the file updates its times only when the kernel
notices it; adapters are written by tools that write files, not by mappings.
Thread-safe (reads run on a pool).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loraserve.lora.catalogue import PEFT_FILES

MARGIN_NS = 2_000_000_000  # a file's times must be this much older than the read's start
MAX_ENTRIES = 8192  # files remembered (least recently used dropped first)

Identity = tuple[str, tuple[tuple[int, int, int, int, int], ...]]


def identity(path: str | Path) -> Identity | None:
    """The identity of an adapter's file (or PEFT folder's files) now; None if gone."""
    real = os.path.realpath(path)
    files = [os.path.join(real, f) for f in PEFT_FILES] if os.path.isdir(real) else [real]
    try:
        stats = [os.stat(f) for f in files]
    except OSError:
        return None
    return real, tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in stats)


@dataclass(frozen=True)
class Seen:
    """A read about to start: the file's identity before it, the id remembered for that
    identity (or None), and whether the file is old enough for its id to be remembered."""

    path: Path
    key: Identity | None
    known: str | None
    settled: bool


class ContentIds:
    """File identity -> content id, for one model (the registry's: ids depend on how the
    model's config reads the file)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._lock = threading.Lock()
        self._ids: OrderedDict[Identity, str] = OrderedDict()
        self._max = max_entries
        self.hits = 0  # reads that skipped hashing

    def __len__(self) -> int:
        return len(self._ids)

    def before_read(self, path: str | Path) -> Seen:
        """Call before reading ``path``: its identity and remembered id."""
        started = time.time_ns()
        key = identity(path)
        known = None
        if key is not None:
            with self._lock:
                known = self._ids.get(key)
                if known is not None:
                    self._ids.move_to_end(key)
        settled = key is not None and all(
            max(mtime, ctime) < started - MARGIN_NS for _, _, _, mtime, ctime in key[1]
        )
        return Seen(Path(path), key, known, settled)

    def content_id(self, seen: Seen, compute: Callable[[], str]) -> str:
        """The content id of what was just read (its values copied already): the id
        remembered for the file if its identity is still the one seen before the read,
        else ``compute()`` (the hash of the values), remembered when the file is settled
        and did not change meanwhile."""
        if seen.known is not None and identity(seen.path) == seen.key:
            self.hits += 1
            return seen.known
        cid = compute()
        if seen.key is not None and seen.settled and identity(seen.path) == seen.key:
            with self._lock:
                self._ids[seen.key] = cid
                self._ids.move_to_end(seen.key)
                while len(self._ids) > self._max:
                    self._ids.popitem(last=False)
        return cid
