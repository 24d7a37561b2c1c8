"""The MCP servers of one loraserve process: tool discovery at start, one live transport
per server spawned on demand, respawned after a crash, and a shutdown that fails every
pending call at once (llama-server's `server_mcp`, tools/server/server-mcp.cpp)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from loraserve.server.tools.mcp import (
    COOLDOWN_S,
    WARMUP_TIMEOUT_S,
    McpError,
    McpTransport,
    tool_result,
)
from loraserve.server.tools.mcp_config import McpServerConfig

log = logging.getLogger("loraserve.tools")


@dataclass(frozen=True)
class McpToolDef:
    """One tool an MCP server listed at start."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]


class McpManager:
    """Every configured MCP server (see the module docstring)."""

    def __init__(self, configs: tuple[McpServerConfig, ...]) -> None:
        self.configs = {c.name: c for c in configs}
        self.tools: list[McpToolDef] = []
        self.transports: dict[str, McpTransport] = {}
        self.dead_until: dict[str, float] = {}
        self.locks = {name: asyncio.Lock() for name in self.configs}
        self.stopping = False
        self.closing: set[McpTransport] = set()

    @property
    def empty(self) -> bool:
        return not self.configs

    async def _discover(self, cfg: McpServerConfig) -> list[McpToolDef]:
        t = McpTransport(cfg)
        try:
            await t.start()
            listed = await asyncio.wait_for(t.list_tools(WARMUP_TIMEOUT_S), WARMUP_TIMEOUT_S)
        except (OSError, McpError, TimeoutError) as e:
            log.warning("MCP warmup: %r failed: %s (%s)", cfg.name, e, t.diagnostics())
            return []
        finally:
            await t.close()
        log.info("MCP warmup: %r discovered %d tools", cfg.name, len(listed))
        out = []
        for tool in listed:
            schema = tool.get("inputSchema")
            desc = tool.get("description")
            out.append(
                McpToolDef(
                    cfg.name,
                    tool["name"],
                    desc if isinstance(desc, str) else "",
                    schema if isinstance(schema, dict) else {},
                )
            )
        return out

    async def warmup(self) -> None:
        """Spawn every server once (all at once), list its tools, stop it."""
        found = await asyncio.gather(*(self._discover(c) for c in self.configs.values()))
        self.tools = [t for group in found for t in group]

    async def _transport(self, name: str) -> McpTransport | None:
        async with self.locks[name]:
            if self.stopping:
                return None
            live = self.transports.get(name)
            if live is not None and live.alive:
                return live
            if live is not None:
                log.warning("MCP %r is no longer alive: %s", name, live.diagnostics())
                del self.transports[name]
                self._close_soon(live)
            if time.monotonic() < self.dead_until.get(name, 0.0):
                return None
            fresh = McpTransport(self.configs[name])
            try:
                await fresh.start()
            except OSError as e:
                log.warning("MCP %r: failed to start: %s", name, e)
                self.dead_until[name] = time.monotonic() + COOLDOWN_S
                return None
            self.transports[name] = fresh
            return fresh

    def _close_soon(self, t: McpTransport) -> None:
        self.closing.add(t)
        task = asyncio.ensure_future(t.close())
        task.add_done_callback(lambda _: self.closing.discard(t))

    async def call_tool(self, server: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The `/tools` answer of one call (`plain_text_response`, or `error`)."""
        if server not in self.configs:
            return {"error": f"MCP server unavailable: {server}"}
        t = await self._transport(server)
        if t is None:
            return {"error": f"MCP server unavailable: {server}"}
        timeout = self.configs[server].timeout_ms / 1000
        try:
            await t.ensure_init(timeout)
            result = await t.request("tools/call", {"name": tool, "arguments": arguments}, timeout)
        except McpError as e:
            return {"error": str(e)}
        return tool_result(result)

    def begin_shutdown(self) -> None:
        """Stop at once: no new calls, every server's group killed, pending calls failed.
        Safe to call more than once; `shutdown` finishes the job."""
        self.stopping = True
        for t in self.transports.values():
            t.kill()

    async def shutdown(self) -> None:
        """`begin_shutdown`, then close every transport (bounded: never waits on pipes)."""
        self.begin_shutdown()
        closing = [*self.transports.values(), *self.closing]
        self.transports.clear()
        await asyncio.gather(*(t.close() for t in closing), return_exceptions=True)
