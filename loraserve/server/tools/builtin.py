"""The built-in tools, named and shaped as llama-server's (tools/server/server-tools.cpp):
`read_file`, `file_glob_search`, `grep_search`, `exec_shell_command`, `write_file`,
`edit_file`, `get_info`.

A `Tool` is its `GET /tools` entry (display name, permissions, the OpenAI function
definition) and an `invoke` that takes the call's parameters and a `Call` (the confinement,
the working directory, the `x-resp-type` header, and for a streamed call where its output
chunks go). A tool's failure is a `ToolError`, answered as `{"error": ...}`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loraserve.server.offload import io_thread
from loraserve.server.tools.confine import Confinement, ToolError

Emit = Callable[[str], Awaitable[None]]


@dataclass
class Call:
    """What one `POST /tools` call runs with besides its parameters."""

    conf: Confinement
    cwd: str  # real path inside the root
    resp_type: str = ""  # the x-resp-type header (read_file: "base64")
    emit: Emit | None = None  # set for a streamed call (exec_shell_command)

    def path(self, params: dict[str, Any], key: str = "path") -> str:
        """The confined real path of parameter `key` (a string, required)."""
        return self.conf.resolve(str_param(params, key), self.cwd)


def str_param(params: dict[str, Any], key: str, default: str | None = None) -> str:
    """Parameter `key` as a string; missing (without a default) or not a string is a
    `ParamError`."""
    value = params.get(key, default)
    if value is None:
        raise ParamError(f"missing parameter {key!r}")
    if not isinstance(value, str):
        raise ParamError(f"parameter {key!r} must be a string, got {type(value).__name__}")
    return value


def int_param(params: dict[str, Any], key: str, default: int) -> int:
    """Parameter `key` as an integer (JSON integer, not a boolean), else `default`."""
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParamError(f"parameter {key!r} must be an integer, got {value!r}")
    return value


def bool_param(params: dict[str, Any], key: str) -> bool:
    """Parameter `key` as a boolean (default false)."""
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise ParamError(f"parameter {key!r} must be a boolean, got {value!r}")
    return value


class ParamError(ValueError):
    """A call's parameters do not fit the tool's definition (a 400)."""


@dataclass(frozen=True)
class Tool:
    """One tool of `GET /tools` and `POST /tools`."""

    name: str
    display_name: str
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...] = ()
    run: Callable[[dict[str, Any], Call], Any] | None = None  # sync, run in a thread
    run_async: Callable[[dict[str, Any], Call], Awaitable[Any]] | None = None
    permission_write: bool = False
    support_stream: bool = False
    uses_cwd: bool = True
    kind: str = "server"  # "server" (built-in) or "mcp"
    schema: dict[str, Any] | None = None  # the parameters as given (MCP), else built

    def definition(self) -> dict[str, Any]:
        """The OpenAI function definition the model is given."""
        parameters: dict[str, Any] = {"type": "object", "properties": self.properties}
        if self.required:
            parameters["required"] = list(self.required)
        if self.schema is not None:
            parameters = self.schema
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }

    def to_json(self) -> dict[str, Any]:
        """The `GET /tools` entry (llama-server's `server_tool::to_json`)."""
        return {
            "display_name": self.display_name,
            "tool": self.name,
            "type": self.kind,
            "permissions": {"write": self.permission_write},
            "uses_cwd": self.uses_cwd,
            "definition": self.definition(),
        }

    async def invoke(self, params: dict[str, Any], call: Call) -> Any:
        """The tool's answer (a JSON object); raises `ToolError` or `ParamError`."""
        if self.run_async is not None:
            return await self.run_async(params, call)
        assert self.run is not None
        return await io_thread(self.run, params, call)  # a tool may wait long


def builtin_tools() -> list[Tool]:
    """Every built-in tool, in llama-server's order."""
    from loraserve.server.tools import files, search, shell

    return [
        files.READ_FILE,
        search.FILE_GLOB_SEARCH,
        search.GREP_SEARCH,
        shell.EXEC_SHELL_COMMAND,
        files.WRITE_FILE,
        files.EDIT_FILE,
        shell.GET_INFO,
    ]


BUILTIN_NAMES = (
    "read_file",
    "file_glob_search",
    "grep_search",
    "exec_shell_command",
    "write_file",
    "edit_file",
    "get_info",
)
SHELL_TOOL = "exec_shell_command"

__all__ = ["BUILTIN_NAMES", "Call", "ParamError", "SHELL_TOOL", "Tool", "ToolError"]
