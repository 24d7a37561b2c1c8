"""MCP server definitions (`--mcp-servers-config FILE`, `--mcp-servers-json JSON`), in the
Cursor format llama-server reads (tools/server/server-mcp.cpp `parse_cursor_format`):

    {"mcpServers": {"NAME": {"command": "...", "args": [...], "env": {...},
                             "cwd": "...", "timeout_ms": 30000}}}

An entry without a command is skipped (with a warning), as is a name already defined;
JSON that does not parse, or a field of the wrong type, is an error naming the entry.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("loraserve.tools")

DEFAULT_TIMEOUT_MS = 30000


@dataclass(frozen=True)
class McpServerConfig:
    """One stdio MCP server: how to start it and how long one of its tool calls may take."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = ""
    timeout_ms: int = DEFAULT_TIMEOUT_MS


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be an array of strings")
    return tuple(value)


def _entry(name: str, raw: Any) -> McpServerConfig | None:
    if not isinstance(raw, dict):
        raise ValueError(f"server {name!r} must be an object")
    command = raw.get("command", "")
    if not isinstance(command, str):
        raise ValueError(f"server {name!r}: command must be a string")
    if not command:
        log.warning("MCP server %r has no command, skipping", name)
        return None
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError(f"server {name!r}: env must be an object of strings")
    cwd = raw.get("cwd", "")
    timeout = raw.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if not isinstance(cwd, str):
        raise ValueError(f"server {name!r}: cwd must be a string")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
        raise ValueError(f"server {name!r}: timeout_ms must be a positive integer")
    return McpServerConfig(
        name=name,
        command=command,
        args=_strings(raw.get("args", []), f"server {name!r}: args"),
        env=tuple(sorted(env.items())),
        cwd=cwd,
        timeout_ms=timeout,
    )


def parse_mcp_json(
    text: str, known: tuple[McpServerConfig, ...] = ()
) -> tuple[McpServerConfig, ...]:
    """The servers `text` defines, after `known` (a name defined twice keeps the first);
    raises ValueError ("failed to parse MCP config JSON: ...")."""
    try:
        doc = json.loads(text)
        servers = doc.get("mcpServers") if isinstance(doc, dict) else None
        if not isinstance(servers, dict):
            log.warning("MCP config: no servers found in JSON")
            return known
        out = list(known)
        for name, raw in servers.items():
            cfg = _entry(name, raw)
            if cfg is None:
                continue
            if any(c.name == name for c in out):
                log.warning("MCP config: duplicate server name %r, skipping", name)
                continue
            out.append(cfg)
        return tuple(out)
    except ValueError as e:
        raise ValueError(f"failed to parse MCP config JSON: {e}") from None
