"""The log handler never blocks the logging thread on a stalled stderr (issue 31)."""

from __future__ import annotations

import io
import logging
import threading

from loraserve.logsink import QueuedStreamHandler


class StalledStream(io.StringIO):
    """A stream whose writes block until ``go`` is set, like a pipe nobody reads."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def write(self, s: str) -> int:
        self.go.wait()
        return super().write(s)


def make(capacity: int) -> tuple[logging.Logger, QueuedStreamHandler, StalledStream]:
    stream = StalledStream()
    handler = QueuedStreamHandler(stream, capacity=capacity)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(f"logsink-test-{id(handler)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger, handler, stream


def test_logging_returns_while_stream_stalls_and_drops_are_reported() -> None:
    logger, handler, stream = make(capacity=4)

    def log_many() -> None:
        for i in range(50):
            logger.info("line %d", i)

    t = threading.Thread(target=log_many, daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "logging blocked on a stalled stream"
    assert handler.dropped_total > 0  # past the capacity lines are dropped, not waited for
    stream.go.set()
    assert handler.drain(timeout_s=30)
    logger.info("after the stall")  # the first line with room again carries the note
    assert handler.drain(timeout_s=30)
    out = stream.getvalue().splitlines()
    assert out[-2:] == [
        f"[log] {handler.dropped_total} lines dropped: stderr was not read",
        "after the stall",
    ]
    out = out[:-2]
    assert out[0] == "line 0"
    kept = [line for line in out if line.startswith("line ")]
    assert len(kept) + handler.dropped_total == 50
    assert kept == sorted(kept, key=lambda s: int(s.split()[1]))  # order kept


def test_flush_writes_everything_when_the_reader_keeps_up() -> None:
    logger, handler, stream = make(capacity=1000)
    stream.go.set()
    for i in range(200):
        logger.warning("w%d", i)
    handler.flush()
    assert stream.getvalue().splitlines() == [f"w{i}" for i in range(200)]
    assert handler.dropped_total == 0


def test_a_bad_format_argument_does_not_raise() -> None:
    logger, handler, stream = make(capacity=10)
    stream.go.set()
    logging.raiseExceptions, old = False, logging.raiseExceptions
    try:
        logger.info("%d", "not a number")
        logger.info("after")
    finally:
        logging.raiseExceptions = old
    handler.flush()
    assert stream.getvalue().splitlines() == ["after"]
