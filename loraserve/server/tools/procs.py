"""Child processes of the tools (shell commands, MCP servers): each runs in its own session
(process group) so that killing the group takes its own children with it, and is closed
without ever waiting for an end of file on its pipes, which a descendant that left the group
may hold open forever (asyncio's `Process.wait()` only returns once every pipe is closed)."""

from __future__ import annotations

import asyncio
import os
import signal


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group `proc` leads (its session), if it still exists."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close our ends of `proc`'s pipes now (asyncio's transport: it also kills `proc` if it
    still runs), so that waiting for it no longer depends on who else holds them."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


async def reap(proc: asyncio.subprocess.Process, grace_s: float = 2.0) -> int:
    """`proc`'s exit status: waits up to `grace_s` for it to exit, then kills its group;
    closes the pipes first so the wait cannot hang on a descendant holding them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while proc.returncode is None and loop.time() < deadline:
        await asyncio.sleep(0.02)
    if proc.returncode is None:
        kill_group(proc)
    close_pipes(proc)
    try:
        return await asyncio.wait_for(proc.wait(), 1.0)
    except TimeoutError:
        return proc.returncode if proc.returncode is not None else -signal.SIGKILL
