"""Where work that would hold the event loop up runs: CPU-bound request preparation on a
small pool (`install`: the loop's default executor, so `asyncio.to_thread` lands there), and
blocking waits on files, processes or model loads on a larger one (`io_thread`).

Why the CPU pool has one thread: Python threads share one GIL, so parsing, tokenizing,
rendering and encoding in six worker threads at once is no faster than in one, but every one
of them is a thread the event loop may queue behind (each up to the interpreter's switch
interval, 5 ms) whenever it takes the GIL back after a system call. In the hostile load test
(`tests/hardening/test_hostile_load.py`, rounds alternated on one server, loaded machine)
`/health` p99 was 452 ms with the default pool (cores + 4 threads), 248 ms with two threads
and 129 ms with one. Small jobs stay on the loop (`body.BIG_BODY_BYTES`,
`generation.BIG_PROMPT_CHARS`), so one large request delays only other large ones.

`install` also lowers the interpreter's switch interval from 5 ms to `SWITCH_INTERVAL_S`, the
longest a thread asking for the GIL waits before the holder must hand it over: the event loop
takes the GIL back after every system call, so each of those waits is on `/health`'s path.
Side by side in the same test (one CPU thread), the median `/health` went from 59-63 ms to
34-38 ms; the p99, set by the loaded machine's scheduling, moved within its noise.

The threads that do the heavy work (this pool's, the I/O pool's and the engine thread) run
at a lower scheduling priority than the event loop (`lower_priority`: nice +5 on Linux,
`LORASERVE_BACKGROUND_NICE` to change, 0 = off). Measured with `bench/hostile_health.py`:
a trivial callback on the loop (an `Event.set`, a `set.discard`) waited 30-90 ms of wall
time with no CPU of its own, for the GIL and for a core: whenever the loop thread wakes from
`epoll`, the engine and preparation threads are runnable too, and on 2 busy cores the
kernel's scheduler may run them first, GIL holders or not. Niced, they yield the core to
the loop when it wakes; when the loop idles they run as fast as before. Alternated runs of
the hostile load on one loaded machine (server in its own process, probed from another):
`/health` p99 89-242 ms (uvloop, default) and 65-115 ms niced (`VAR_NICE=5`, 6 rounds each).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
SWITCH_INTERVAL_S = 0.001  # sys.setswitchinterval (the interpreter's default: 0.005)
CPU_THREADS = 1  # request preparation (JSON, tokenizing, templates, grammars) at once
IO_THREADS = 16  # blocking waits (file and slot I/O, tools, model loads) at once

BACKGROUND_NICE = int(os.environ.get("LORASERVE_BACKGROUND_NICE", "5"))


def lower_priority(native_id: int | None = None) -> None:
    """Lower a thread's scheduling priority (this one's by default) by `BACKGROUND_NICE`
    (Linux only: its nice value is per thread; elsewhere PRIO_PROCESS would name a process,
    so nothing is done). A failure (a sandbox) changes nothing."""
    if sys.platform != "linux" or BACKGROUND_NICE <= 0:
        return
    tid = threading.get_native_id() if native_id is None else native_id
    try:
        nice = os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE
        os.setpriority(os.PRIO_PROCESS, tid, min(19, nice))
    except OSError:
        pass


_io_pool = ThreadPoolExecutor(
    max_workers=IO_THREADS, thread_name_prefix="loraserve-io", initializer=lower_priority
)
_installed: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Make a `CPU_THREADS` pool the loop's default executor (`asyncio.to_thread`), once
    per loop (a router runs its engines' apps on its own loop), and set the process's GIL
    switch interval to `SWITCH_INTERVAL_S`."""
    if loop in _installed:
        return
    _installed.add(loop)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    pool = ThreadPoolExecutor(
        max_workers=CPU_THREADS, thread_name_prefix="loraserve-prep", initializer=lower_priority
    )
    loop.set_default_executor(pool)


async def io_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the I/O pool (a call that mostly waits: it must not take
    one of the few CPU threads for its whole wait), with the caller's context variables."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    call = functools.partial(ctx.run, fn, *args, **kwargs)
    return await loop.run_in_executor(_io_pool, call)
