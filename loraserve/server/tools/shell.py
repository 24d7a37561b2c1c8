"""`exec_shell_command` and `get_info` (llama-server's definitions, limits and answers;
server-tools.cpp). The shell tool is only ever enabled by name (`--tools` listing it, or
`all`): its working directory is confined, its command is not.

Commands run as `sh -c COMMAND` in their own session (process group), stdin closed, stdout
and stderr combined; a timeout or a client that leaves kills the whole group, so a
command's own children go too, and reading stops at that point even if some descendant that
left the group still holds the pipe.
"""

from __future__ import annotations

import asyncio
import codecs
import platform
from typing import Any

from loraserve.server.tools.builtin import Call, Tool, int_param
from loraserve.server.tools.builtin import str_param as text
from loraserve.server.tools.procs import close_pipes, kill_group, reap

SHELL_MAX_OUTPUT = 16 * 1024  # bytes
SHELL_MAX_TIMEOUT_S = 60
SHELL_DEFAULT_TIMEOUT_S = 10


async def run_command(
    argv: list[str], cwd: str, timeout_s: float, max_output: int, call: Call | None = None
) -> tuple[str, int, bool]:
    """(output, exit code, timed out) of `argv` run in `cwd`; chunks go to `call.emit` as
    they arrive when the call is streamed. The output past `max_output` bytes is drained
    and dropped, then marked `[output truncated]`."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    kept, truncated, timed_out = bytearray(), False, False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                timed_out = True
                kill_group(proc)
                break
            try:
                chunk = await asyncio.wait_for(proc.stdout.read(4096), left)
            except TimeoutError:
                continue
            if not chunk:
                break
            if truncated:
                continue
            room = max_output - len(kept)
            piece = chunk[:room]
            truncated = len(chunk) > room
            kept += piece
            if call is not None and call.emit is not None and piece:
                await call.emit(decoder.decode(piece))
        code = await reap(proc)
    except BaseException:  # the client left (cancelled) or the server stops: no orphans
        kill_group(proc)
        close_pipes(proc)
        raise
    out = kept.decode("utf-8", "replace")
    if truncated:
        out += "\n[output truncated]"
        if call is not None and call.emit is not None:
            await call.emit("\n[output truncated]")
    return out, code, timed_out


async def exec_shell_command(params: dict[str, Any], call: Call) -> dict[str, Any] | None:
    """Run `command` with `sh -c` in the call's working directory."""
    command = text(params, "command")
    timeout = min(int_param(params, "timeout", SHELL_DEFAULT_TIMEOUT_S), SHELL_MAX_TIMEOUT_S)
    max_output = min(int_param(params, "max_output_size", SHELL_MAX_OUTPUT), SHELL_MAX_OUTPUT)
    out, code, timed_out = await run_command(
        ["sh", "-c", command], call.cwd, max(timeout, 0), max(max_output, 0), call
    )
    tail = f"\n[exit code: {code}]" + (" [exit due to timed out]" if timed_out else "")
    if call.emit is not None:
        await call.emit(tail)
        return None
    return {"plain_text_response": out + tail}


async def get_info(params: dict[str, Any], call: Call) -> dict[str, Any]:
    """The OS (`uname -a`) and the call's working directory."""
    try:
        out, code, timed_out = await run_command(["uname", "-a"], call.cwd, 5, 4096)
        os_info = out.strip() if code == 0 and not timed_out else "unknown"
    except OSError:
        os_info = platform.platform() or "unknown"
    return {"os": os_info, "cwd": call.cwd}


EXEC_SHELL_COMMAND = Tool(
    "exec_shell_command",
    "Execute shell command",
    "Execute a shell command and return its output (stdout and stderr combined).",
    {
        "command": {"type": "string", "description": "Shell command to execute"},
        "timeout": {
            "type": "integer",
            "description": f"Timeout in seconds (default 10, max {SHELL_MAX_TIMEOUT_S})",
        },
        "max_output_size": {
            "type": "integer",
            "description": f"Maximum output size in bytes (default {SHELL_MAX_OUTPUT})",
        },
    },
    ("command",),
    run_async=exec_shell_command,
    permission_write=True,
    support_stream=True,
)
GET_INFO = Tool(
    "get_info",
    "Get Runtime Info",
    "Returns runtime info: the OS name/version and the current working directory",
    {},
    run_async=get_info,
)
