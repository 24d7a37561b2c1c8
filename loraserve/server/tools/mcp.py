"""The MCP client: stdio servers (one JSON-RPC message per line) started from
`mcp_config`, their tools offered as `<server>_<tool>` (tools/server/server-mcp.cpp).

This is a small asyncio client of our own rather than the official `mcp` SDK: the SDK's
stdio client has open bugs that leave orphan server processes behind and hang on shutdown
when the server (or a grandchild it spawned) keeps the pipes open. Here every server runs in
its own session (process group) and is closed by killing that group; a close never waits for
an end of file on the pipes (a grandchild that left the group may hold them forever): the
pending calls are failed, the reader tasks cancelled and the pipes closed from our side.

Lifecycle, as llama-server's: at start every server is spawned once to list its tools
(`warmup`, at most `WARMUP_TIMEOUT_S` each, all at once), then stopped; a tool call spawns
its server again when none is alive (after a crash too: lazy respawn), a server that cannot
start is not tried again for `COOLDOWN_S`. Each call waits at most the server's `timeout_ms`.
Lines that are not JSON-RPC answers (garbage, notifications, requests) are skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import deque
from typing import Any

from loraserve.server.tools.mcp_config import McpServerConfig
from loraserve.server.tools.procs import close_pipes, kill_group

log = logging.getLogger("loraserve.tools")

PROTOCOL_VERSION = "2024-11-05"
WARMUP_TIMEOUT_S = 10.0
COOLDOWN_S = 5.0
LINE_LIMIT = 16 << 20  # bytes of one JSON-RPC line


class McpError(Exception):
    """A failed request to an MCP server (its message is what the caller sees)."""


class McpTransport:
    """One running MCP server process and the requests in flight to it."""

    def __init__(self, cfg: McpServerConfig) -> None:
        self.cfg = cfg
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.next_id = 1
        self.closed = False
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self.tasks: list[asyncio.Task[None]] = []
        self.init_lock = asyncio.Lock()
        self.initialized = False

    @property
    def alive(self) -> bool:
        return not self.closed and self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Spawn the server; raises OSError when the command cannot run."""
        env = {**os.environ, **dict(self.cfg.env)}
        self.proc = await asyncio.create_subprocess_exec(
            self.cfg.command,
            *self.cfg.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.cfg.cwd or None,
            env=env,
            start_new_session=True,
            limit=LINE_LIMIT,
        )
        self.tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._drain_err())]

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    log.debug("MCP %s: skipped a line that is not JSON", self.cfg.name)
                    continue
                if not isinstance(msg, dict) or "method" in msg:
                    continue  # a notification or a request from the server
                fut = self.pending.pop(msg.get("id"), None) if _hashable(msg.get("id")) else None
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (ValueError, OSError):  # a line over LINE_LIMIT, a broken pipe
            pass
        self._fail_pending("transport closed")
        self.kill()  # no reader, no answers: the next call starts a fresh server

    async def _drain_err(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            while line := await self.proc.stderr.readline():
                self.stderr_tail.append(line.decode("utf-8", "replace").rstrip())
        except (ValueError, OSError):
            pass

    def _fail_pending(self, why: str) -> None:
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(McpError(why))
        self.pending.clear()

    def diagnostics(self) -> str:
        """What the server last printed on stderr, and its exit status if it exited."""
        code = None if self.proc is None else self.proc.returncode
        tail = " | ".join(self.stderr_tail)[-500:]
        return f"exit status {code}, stderr: {tail or '(empty)'}"

    async def request(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        """The `result` of one JSON-RPC request; raises McpError on an error answer, a
        timeout or a closed transport."""
        if not self.alive:
            raise McpError("transport closed")
        assert self.proc is not None and self.proc.stdin is not None
        rid = self.next_id
        self.next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        try:
            self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
            await self.proc.stdin.drain()
            reply = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise McpError("request timed out") from None
        except (OSError, RuntimeError):  # the pipe broke under the write
            raise McpError("transport closed") from None
        finally:
            self.pending.pop(rid, None)
        if "error" in reply:
            err = reply["error"]
            message = err.get("message") if isinstance(err, dict) else err
            raise McpError(message if isinstance(message, str) else "unknown error")
        if "result" not in reply:
            raise McpError("invalid response from MCP server")
        return reply["result"]

    async def ensure_init(self, timeout: float) -> None:
        """`initialize` then `notifications/initialized`, once per process."""
        async with self.init_lock:
            if self.initialized:
                return
            params = {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "loraserve", "version": "1.0"},
            }
            try:
                await self.request("initialize", params, timeout)
            except McpError as e:
                raise McpError(f"initialize failed: {e}") from None
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(note).encode() + b"\n")
            self.initialized = True

    async def list_tools(self, timeout: float) -> list[dict[str, Any]]:
        """The server's tools (`tools/list`), each a dict with at least a string `name`."""
        await self.ensure_init(timeout)
        result = await self.request("tools/list", {}, timeout)
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return []
        return [t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]

    def kill(self) -> None:
        """Kill the server's process group and fail what is pending, without waiting."""
        self.closed = True
        if self.proc is not None and self.proc.returncode is None:
            kill_group(self.proc)
        self._fail_pending("the MCP server was stopped")

    async def close(self) -> None:
        """`kill`, then cancel the readers and close the pipes; never waits for EOF, and
        waits at most a second for the process itself to be reaped."""
        self.kill()
        for task in self.tasks:
            task.cancel()
        if self.proc is None:
            return
        close_pipes(self.proc)
        try:
            await asyncio.wait_for(self.proc.wait(), 1.0)
        except TimeoutError:
            log.warning("MCP %s: process %d not reaped after kill", self.cfg.name, self.proc.pid)


def _hashable(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def tool_result(result: Any) -> dict[str, Any]:
    """A `tools/call` result as the `/tools` answer: the text parts joined by newlines as
    `plain_text_response`, or `error` when the result says `isError`."""
    parts = result.get("content") if isinstance(result, dict) else None
    texts = [
        p.get("text", "")
        for p in (parts if isinstance(parts, list) else [])
        if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text", ""), str)
    ]
    text = "\n".join(texts)
    if isinstance(result, dict) and result.get("isError") is True:
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}
