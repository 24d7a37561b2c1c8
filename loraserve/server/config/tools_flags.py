"""Flags of the built-in tools, the MCP client and the MCP CORS proxy, named as llama-server
names them (`--tools`, `--tools-runtime`, `--mcp-servers-config`, `--mcp-servers-json`,
`--ui-mcp-proxy`, `-ag/--agent`; common/arg.cpp of the llama.cpp in the llama-cpp-python
0.3.36 sdist), plus loraserve's `--tools-root`; served by `server/tools/`.

As llama-server does, enabling tools or MCP servers narrows `--cors-origins` to `localhost`
unless `--cors-origins` is given. The shell tool runs only when `--tools` names it (or says
`all`, or `--agent`). Every mistake is a usage error at start: an unknown tool name, a
`--tools-runtime` loraserve cannot use (see `tools/runtime.py`), an MCP file that cannot be
read or JSON that does not parse, a `--tools-root` that is not a directory.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from typing import Any

from loraserve.server.tools.builtin import BUILTIN_NAMES
from loraserve.server.tools.mcp_config import McpServerConfig, parse_mcp_json
from loraserve.server.tools.runtime import RuntimeSpecError, check_runtime

log = logging.getLogger("loraserve.server")
ROOT_ENV = "LORASERVE_TOOLS_ROOT"  # the default of --tools-root


@dataclass(frozen=True)
class ToolsConfig:
    """The tools' part of `ServerConfig`: enabled built-in tools (llama-server's order),
    the root they are confined to (absolute), the MCP servers, the MCP CORS proxy."""

    tools: tuple[str, ...] = ()
    root: str = ""
    mcp_servers: tuple[McpServerConfig, ...] = ()
    ui_mcp_proxy: bool = False

    @property
    def enabled(self) -> bool:
        """Whether `/tools` is served (built-in tools or MCP servers configured)."""
        return bool(self.tools or self.mcp_servers)


class _Agent(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        namespace.agent = option_string in ("-ag", "--agent")


def add_flags(p: argparse.ArgumentParser) -> None:
    """Register the tools flags."""
    g = p.add_argument_group("built-in tools and MCP servers (for agents: trusted use only)")
    a = g.add_argument
    a(
        "--tools",
        dest="tools_list",
        metavar="TOOL1,TOOL2,...",
        help="built-in tools to enable, or 'all' (default: none): " + ", ".join(BUILTIN_NAMES),
    )
    a(
        "--tools-runtime",
        metavar="OPTION",
        help="docker:<image>, podman:<image>, docker-container:<id>, podman-container:<id>, "
        "ssh:<target>: parsed as llama-server does, refused (loraserve runs tools on the host)",
    )
    a(
        "--tools-root",
        metavar="DIR",
        help=f"directory the tools are confined to ('..', absolute paths and symlinks out "
        f"are refused) (default: ${ROOT_ENV}, else the working directory)",
    )
    a("--mcp-servers-config", metavar="PATH", help="JSON file of MCP servers (Cursor format)")
    a("--mcp-servers-json", metavar="JSON", help="inline JSON of MCP servers (Cursor format)")
    a(
        "--ui-mcp-proxy",
        "--webui-mcp-proxy",
        "--no-ui-mcp-proxy",
        "--no-webui-mcp-proxy",
        dest="ui_mcp_proxy_flag",
        nargs=0,
        action=_Switch,
        help="serve /cors-proxy for the web UI's remote MCP servers (default: off)",
    )
    a(
        "-ag",
        "--agent",
        "-no-ag",
        "--no-agent",
        dest="agent",
        nargs=0,
        action=_Agent,
        help="all built-in tools and the MCP proxy (default: off)",
    )
    p.set_defaults(agent=None, ui_mcp_proxy_flag=False)


class _Switch(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        setattr(namespace, self.dest, not str(option_string).startswith("--no-"))


def _tools(parser: argparse.ArgumentParser, raw: str | None) -> tuple[str, ...]:
    names = [n.strip() for n in (raw or "").split(",") if n.strip()]
    for name in names:
        if name != "all" and name not in BUILTIN_NAMES:
            parser.error(
                f'argument --tools: unknown tool "{name}". available tools: '
                + ", ".join(BUILTIN_NAMES)
            )
    return tuple(n for n in BUILTIN_NAMES if n in names or "all" in names)


def _mcp(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> tuple[McpServerConfig, ...]:
    servers: tuple[McpServerConfig, ...] = ()
    try:
        if ns.mcp_servers_config is not None:
            try:
                with open(ns.mcp_servers_config, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                parser.error(
                    f"argument --mcp-servers-config: failed to open MCP config file: "
                    f"{ns.mcp_servers_config} ({e.strerror})"
                )
            servers = parse_mcp_json(text, servers)
        if ns.mcp_servers_json is not None:
            servers = parse_mcp_json(ns.mcp_servers_json, servers)
    except ValueError as e:
        parser.error(f"argument --mcp-servers-config/--mcp-servers-json: {e}")
    return servers


def config(
    ns: argparse.Namespace, parser: argparse.ArgumentParser, values: dict[str, Any]
) -> dict[str, Any]:
    """The `ServerConfig` values of these flags: `tools` (a `ToolsConfig`) and, when tools
    or MCP servers are on and `--cors-origins` was not given, `cors_origins` "localhost"."""
    tools = _tools(parser, ns.tools_list)
    proxy = ns.ui_mcp_proxy_flag
    if ns.agent is not None:
        tools, proxy = (BUILTIN_NAMES, True) if ns.agent else ((), False)
    if ns.tools_runtime is not None:
        try:
            check_runtime(ns.tools_runtime)
        except RuntimeSpecError as e:
            parser.error(f"argument --tools-runtime: {e}")
    root = ns.tools_root or os.environ.get(ROOT_ENV) or os.getcwd()
    if not os.path.isdir(root):
        parser.error(f"argument --tools-root: not a directory: {root!r}")
    mcp_given = ns.mcp_servers_config is not None or ns.mcp_servers_json is not None
    out: dict[str, Any] = {
        "tools": ToolsConfig(tools, os.path.realpath(root), _mcp(parser, ns), proxy)
    }
    explicit = any(str(a).startswith("--cors-o") for a in values.get("argv", ()))
    if (tools or mcp_given) and not explicit:
        log.warning(
            "server tools or MCP servers are enabled, using localhost as default CORS origin "
            "(change via --cors-origins)"
        )
        out["cors_origins"] = "localhost"
    return out
