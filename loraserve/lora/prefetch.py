"""Adapter reads started when a request is submitted, before the engine thread sees it.

A request that names an adapter on disk used to start its read only when the engine
thread received it (between two steps); `Prefetch.start` starts that read at submit time,
on the caller's thread, so the disk read overlaps the request's wait in the inbox and the
decoding of the others. The engine still decides everything at receipt (`AdapterLoads`):
when it needs an adapter read, it `claim`s the prefetched read of the same file, or reads
it itself when there is none.

A read is keyed by the file's identity when it started (real path, device, inode, size,
modification time; a PEFT folder's two files): a claim whose file changed since finds no
read and reads the file anew, so a changed file never serves what was read before. Each
path has at most one read at a time: concurrent submissions of one adapter share it, and
none starts while the engine reads that path (`claim` .. `finish`).
Unclaimed reads (a request refused before receipt) are dropped after `TTL_S` seconds or
beyond `MAX_UNCLAIMED`, so they bound the memory they hold. Thread-safe.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from loraserve.lora.adapter import Adapter
from loraserve.lora.catalogue import PEFT_FILES
from loraserve.lora.content_ids import Identity, identity
from loraserve.lora.registry import AdapterRegistry

MAX_UNCLAIMED = 16  # reads held for requests the engine has not received yet
TTL_S = 10.0  # an unclaimed read older than this is dropped

# (adapter, error, seconds the read took)
ReadResult = tuple[Adapter | None, BaseException | None, float]
FileKey = Identity


def file_key(path: str | Path) -> FileKey | None:
    """The identity of an adapter's file (or PEFT folder's files) now; None if gone: a read
    made under another identity is stale (`content_ids.identity`)."""
    return identity(path)


def disk_path(reg: AdapterRegistry, ref: int | str) -> Path | None:
    """Any thread, best effort: the file of the adapter ``ref`` (an id, or a name with case
    ignored; a catalogue name not registered yet included, by its exact spelling only) if
    it is on disk now; None if it is resident, unknown, or the registry changed under it
    (the engine thread owns the registry: this only reads it)."""
    try:
        if isinstance(ref, int):
            a = reg.get(ref)
        else:
            key = ref.casefold()
            a = next((b for b in reg.list() if b.name.casefold() == key), None)
            if a is None:
                entry = reg.catalogue.lookup(ref, scan=False)
                return entry.path if entry is not None else None
    except (RuntimeError, KeyError, ValueError, OSError):
        return None
    return a.path if not a.weights else None


def will_need(path: str | Path) -> None:
    """Ask the kernel to start reading an adapter's file(s) into the page cache now (it
    does not wait for the disk): a read that waits for a free reader finds them there."""
    real = os.path.realpath(path)
    files = [os.path.join(real, f) for f in PEFT_FILES] if os.path.isdir(real) else [real]
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


class Prefetch:
    """Reads in flight or done, by file, until the engine claims them.

    ``read`` reads a path into an unregistered `Adapter` (any thread, `AdapterRegistry.
    read_path`); ``run`` runs a job off the caller's thread (the engine's read pool)."""

    def __init__(
        self, read: Callable[[Path], Adapter], run: Callable[[Callable[[], None]], None]
    ) -> None:
        self._read, self._run = read, run
        self._lock = threading.Lock()
        self._reads: dict[str, tuple[FileKey, Future[ReadResult], float]] = {}
        self._engine: set[str] = set()  # real paths the engine reads or installs now
        self.started = 0  # reads started here
        self.claimed = 0  # reads the engine used

    def start(self, path: str | Path) -> None:
        """Start reading ``path`` unless a read of the same file is held already."""
        key = file_key(path)
        if key is None:
            return  # gone: the engine's own read names the error
        fut: Future[ReadResult] = Future()
        with self._lock:
            self._expire(time.monotonic())
            held = self._reads.get(key[0])
            if key[0] in self._engine or (held is not None and held[0] == key):
                return
            self._reads[key[0]] = (key, fut, time.monotonic())
            self.started += 1

        def job() -> None:
            t0 = time.perf_counter()
            try:
                out: ReadResult = (self._read(Path(key[0])), None, time.perf_counter() - t0)
            except Exception as e:  # the engine's claim hands it to the requests
                out = (None, e, time.perf_counter() - t0)
            fut.set_result(out)

        will_need(key[0])
        try:
            self._run(job)
        except RuntimeError:  # the pool is shut down: nothing is read here
            with self._lock:
                if self._reads.get(key[0], (None, None))[1] is fut:
                    del self._reads[key[0]]

    def claim(self, path: str | Path) -> Future[ReadResult] | None:
        """The read of ``path``'s current file, taken out (None: none, or the file changed
        since it started: the caller reads it itself). Until `finish`, no read of the path
        starts here."""
        key = file_key(path)
        with self._lock:
            self._engine.add(os.path.realpath(path))
            held = self._reads.pop(key[0], None) if key is not None else None
        if held is None or held[0] != key:
            return None
        self.claimed += 1
        return held[1]

    def finish(self, path: str | Path) -> None:
        """The engine has installed (or failed) its read of ``path``."""
        with self._lock:
            self._engine.discard(os.path.realpath(path))

    def clear(self) -> None:
        """Drop every unclaimed read (their jobs were cancelled: they would never end)."""
        with self._lock:
            self._reads.clear()

    def _expire(self, now: float) -> None:
        old = [p for p, (_, _, t) in self._reads.items() if now - t > TTL_S]
        for p in old:
            del self._reads[p]
        while len(self._reads) >= MAX_UNCLAIMED:  # the oldest first
            del self._reads[min(self._reads, key=lambda p: self._reads[p][2])]
