"""MCP server definitions (Cursor's `mcpServers`, as llama-server's parse_cursor_format
reads them) and the tools flags: `--tools`, `--agent`, `--ui-mcp-proxy`, the CORS narrowing
to localhost unless `--cors-origins` is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraserve.server.config.args import parse_server_args
from loraserve.server.tools.mcp_config import McpServerConfig, parse_mcp_json

ALL = (
    "read_file", "file_glob_search", "grep_search", "exec_shell_command",
    "write_file", "edit_file", "get_info",
)  # fmt: skip


def test_cursor_format() -> None:
    text = json.dumps(
        {
            "mcpServers": {
                "fs": {"command": "npx", "args": ["-y", "srv"], "env": {"A": "1"}},
                "slow": {"command": "py", "cwd": "/tmp", "timeout_ms": 500},
                "empty": {"args": ["x"]},  # no command: skipped
            }
        }
    )
    assert parse_mcp_json(text) == (
        McpServerConfig("fs", "npx", ("-y", "srv"), (("A", "1"),)),
        McpServerConfig("slow", "py", cwd="/tmp", timeout_ms=500),
    )
    assert parse_mcp_json("{}") == () and parse_mcp_json('{"mcpServers": []}') == ()
    first = parse_mcp_json(text)
    again = parse_mcp_json(json.dumps({"mcpServers": {"fs": {"command": "other"}}}), first)
    assert again == first  # a name defined twice keeps the first


@pytest.mark.parametrize(
    "text",
    [
        "not valid json",
        '{"mcpServers": {"a": "npx"}}',
        '{"mcpServers": {"a": {"command": 3}}}',
        '{"mcpServers": {"a": {"command": "x", "args": [1]}}}',
        '{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}',
        '{"mcpServers": {"a": {"command": "x", "timeout_ms": 0}}}',
        '{"mcpServers": {"a": {"command": "x", "timeout_ms": true}}}',
    ],
)
def test_bad_definitions_are_errors(text: str) -> None:
    with pytest.raises(ValueError, match="failed to parse MCP config JSON"):
        parse_mcp_json(text)


def test_tools_flags(tmp_path: Path) -> None:
    root = ["--tools-root", str(tmp_path)]
    cfg = parse_server_args(["--tools", "grep_search,read_file", *root])
    assert cfg.tools.tools == ("read_file", "grep_search") and cfg.cors_origins == "localhost"
    assert parse_server_args(["--tools", "all", *root]).tools.tools == ALL
    cfg = parse_server_args(["-ag", *root])
    assert cfg.tools.tools == ALL and cfg.tools.ui_mcp_proxy
    cfg = parse_server_args(["--agent", "--no-agent", *root])
    assert cfg.tools.tools == () and not cfg.tools.ui_mcp_proxy and cfg.cors_origins == "*"
    cfg = parse_server_args(["--ui-mcp-proxy"])  # the proxy alone does not narrow CORS
    assert cfg.tools.ui_mcp_proxy and not cfg.tools.enabled and cfg.cors_origins == "*"
    for explicit in (["--cors-origins", "*"], ["--cors-origins=https://a.org"]):
        cfg = parse_server_args(["--tools", "all", *root, *explicit])
        assert cfg.cors_origins == explicit[-1].split("=")[-1]
    conf = tmp_path / "mcp.json"
    conf.write_text(json.dumps({"mcpServers": {"a": {"command": "x"}}}))
    inline = json.dumps({"mcpServers": {"b": {"command": "y"}, "a": {"command": "z"}}})
    cfg = parse_server_args(["--mcp-servers-config", str(conf), "--mcp-servers-json", inline])
    assert [(s.name, s.command) for s in cfg.tools.mcp_servers] == [("a", "x"), ("b", "y")]
    assert cfg.tools.enabled and cfg.cors_origins == "localhost"
    assert parse_server_args([]).tools.enabled is False


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tools", "read_file,rm_rf"], 'unknown tool "rm_rf"'),
        (["--tools-root", "/no/such/dir"], "not a directory"),
        (["--tools-runtime", "ssh:-oProxyCommand=x"], "invalid ssh target"),
        (["--tools-runtime", "docker:"], "requires an image name"),
    ],
)
def test_bad_tools_flags(args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        parse_server_args(args)
    assert e.value.code == 2 and message in capsys.readouterr().err
