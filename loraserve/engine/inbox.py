"""The engine's inbox: calls that other threads post to the engine thread, run between
steps in arrival order, and calls that wait there until what they need is free.

Every call's result travels back on a `Future`. Without an engine thread (tests, the
CLI) a call runs at once on the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class EngineBusy(Exception):
    """A call waited its whole time for a slot or an adapter that stayed in use."""


class Inbox:
    """Posted calls, and waiting ones: a waiting call returns None while what it needs is
    in use, and runs again at every `run` until it returns something else or its time
    is up (then its future fails with `EngineBusy`)."""

    def __init__(self) -> None:
        # posted calls: deque's append and popleft are atomic (other threads append, the
        # engine thread alone pops), so a step with nothing posted takes no lock
        self._queue: deque[Callable[[], None]] = deque()
        self._waiting: list[tuple[Callable[[], Any], Future[Any], float, str]] = []
        self.wake = threading.Event()
        self.threaded = False  # set while an engine thread runs `run` between its steps

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """``fn()`` on the engine thread, in arrival order."""
        fut: Future[T] = Future()
        self._post(lambda: _run_into(fn, fut))
        return fut

    def call_when(self, fn: Callable[[], T | None], wait_s: float, busy: str) -> Future[T]:
        """``fn()`` on the engine thread until it returns something other than None, for at
        most ``wait_s`` seconds; then `EngineBusy(busy)`."""
        fut: Future[T] = Future()
        deadline = time.monotonic() + wait_s

        def first() -> None:
            if not self._try(fn, fut):
                self._waiting.append((fn, fut, deadline, busy))

        self._post(first)
        return fut

    @property
    def empty(self) -> bool:
        """Whether no posted call waits to run (waiting calls aside)."""
        return not self._queue

    def run(self) -> None:
        """Engine thread: run what was posted, then retry the waiting calls."""
        while self._queue:
            self._queue.popleft()()
        if not self._waiting:
            return
        now, still = time.monotonic(), []
        for fn, fut, deadline, busy in self._waiting:
            if self._try(fn, fut):
                continue
            if now > deadline:
                fut.set_exception(EngineBusy(busy))
            else:
                still.append((fn, fut, deadline, busy))
        self._waiting = still

    def _post(self, job: Callable[[], None]) -> None:
        if self.threaded:
            self._queue.append(job)
            self.wake.set()
        else:
            job()

    @staticmethod
    def _try(fn: Callable[[], Any], fut: Future[Any]) -> bool:
        try:
            result = fn()
        except BaseException as e:  # handed to the caller
            fut.set_exception(e)
            return True
        if result is None:
            return False
        fut.set_result(result)
        return True


def _run_into(fn: Callable[[], T], fut: Future[T]) -> None:
    try:
        fut.set_result(fn())
    except BaseException as e:  # handed to the caller
        fut.set_exception(e)
