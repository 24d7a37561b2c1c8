"""Logging that never blocks the thread that logs.

A plain ``StreamHandler`` writes to stderr under the logging lock. When whoever reads the
server's stderr stops reading (a full pipe: a supervisor that hangs, a terminal paused with
Ctrl-S), the engine thread blocks inside its next log line while holding that lock, and the
event loop blocks behind it: the whole server freezes (measured with bench.hostile_health,
issue 31). Here records are formatted in the caller, handed to a bounded queue, and written
by one daemon thread; a full queue drops lines and counts them, and once there is room again a note
saying how many were dropped takes their place in the order.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CAPACITY = 10_000  # lines held while the reader is stalled; past it lines are dropped


class QueuedStreamHandler(logging.Handler):
    """Formats in the caller, writes from its own thread; ``emit`` never waits on the stream."""

    def __init__(self, stream: TextIO | None = None, capacity: int = CAPACITY) -> None:
        super().__init__()
        self.stream = stream if stream is not None else sys.stderr
        self.lines: queue.Queue[str | None] = queue.Queue(maxsize=capacity)
        self.dropped = 0  # lines lost since the last note of a gap was queued
        self.dropped_total = 0
        self._drop_lock = threading.Lock()
        self.writer = threading.Thread(target=self._write_loop, name="log-writer", daemon=True)
        self.writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:  # a bad format argument must not fail the caller
            self.handleError(record)
            return
        with self._drop_lock:  # the note of a gap goes where the gap is, in order
            try:
                if self.dropped:
                    note = f"[log] {self.dropped} lines dropped: stderr was not read\n"
                    self.lines.put_nowait(note)
                    self.dropped = 0
                self.lines.put_nowait(line)
            except queue.Full:
                self.dropped += 1
                self.dropped_total += 1

    def _write_loop(self) -> None:
        while (line := self.lines.get()) is not None:
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):  # stderr closed: nothing left to tell
                pass
            finally:
                self.lines.task_done()

    def flush(self) -> None:
        """Called by ``logging.shutdown`` (at exit, and before ``os._exit``): the last lines,
        a fatal error among them, reach stderr unless the reader is stalled past 2 s."""
        self.drain()

    def drain(self, timeout_s: float = 2.0) -> bool:
        """Wait (at most ``timeout_s``) until every queued line is written; True if all were."""
        done = threading.Event()

        def wait() -> None:
            self.lines.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        return done.wait(timeout_s)


def install(level: int = logging.INFO) -> None:
    """Configure the root logger as ``logging.basicConfig`` would, with the queued handler.

    Like ``basicConfig``, it does nothing when the root logger already has handlers (a test
    runner's capture, an embedding application's own setup).
    """
    root = logging.getLogger()
    if root.handlers:
        return
    handler = QueuedStreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
