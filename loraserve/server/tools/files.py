"""The file tools: `read_file`, `write_file`, `edit_file` (llama-server's definitions, limits
and answers; server-tools.cpp). Every path goes through the call's `Confinement`."""

from __future__ import annotations

import base64
import os
from typing import Any

from loraserve.server.tools.builtin import Call, ParamError, Tool, bool_param, int_param
from loraserve.server.tools.builtin import str_param as text
from loraserve.server.tools.confine import ToolError
from loraserve.server.tools.edits import apply_edits

READ_MAX = 16 * 1024  # bytes of text read_file returns
READ_MAX_BASE64 = 32 << 20  # bytes of a file read_file returns as base64 (x-resp-type)


def _read_bytes(path: str, shown: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        raise ToolError(f"failed to open file: {shown}") from None


def read_file(params: dict[str, Any], call: Call) -> dict[str, Any]:
    """A file's lines `start_line`..`end_line` (1-based, inclusive), optionally numbered."""
    shown = text(params, "path")
    path = call.path(params)
    start = int_param(params, "start_line", 1)
    end = int_param(params, "end_line", -1)
    numbered = bool_param(params, "append_loc")
    try:
        size = os.stat(path).st_size
    except OSError:
        raise ToolError(f"cannot stat file: {shown}") from None
    if call.resp_type == "base64":
        if size > READ_MAX_BASE64:
            raise ToolError(f"file too large ({size} bytes, max {READ_MAX_BASE64})")
        data = _read_bytes(path, shown)
        return {"base64": base64.b64encode(data).decode(), "size_bytes": len(data)}
    if size > READ_MAX and end == -1:
        raise ToolError(
            f"file too large ({size} bytes, max {READ_MAX}). "
            "Use start_line/end_line to read a portion."
        )
    lines = _read_bytes(path, shown).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    out = bytearray()
    for lineno, line in enumerate(lines, 1):
        if lineno < start:
            continue
        if end != -1 and lineno > end:
            break
        row = (f"{lineno}\u2192".encode() if numbered else b"") + line + b"\n"
        if len(out) + len(row) > READ_MAX:
            out += b"[output truncated]"
            break
        out += row
    return {"plain_text_response": out.decode("utf-8", "replace")}


def write_file(params: dict[str, Any], call: Call) -> dict[str, Any]:
    """Create or overwrite a file (and its parent directories)."""
    shown = text(params, "path")
    content = text(params, "content")
    path = call.path(params)
    data = content.encode()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    except OSError:
        raise ToolError(f"failed to write file: {shown}") from None
    return {"result": "file written successfully", "path": shown, "bytes": len(data)}


def edit_file(params: dict[str, Any], call: Call) -> dict[str, Any]:
    """Exact-text replacements, each `old_text` unique in the file, none overlapping."""
    shown = text(params, "path")
    raw = params.get("edits")
    if not isinstance(raw, list) or not raw:
        raise ToolError('"edits" must be a non-empty array')
    edits = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise ParamError(f"edits[{i}] must be an object with old_text and new_text")
        old, new = text(e, "old_text"), text(e, "new_text")
        if not old:
            raise ToolError(f"edits[{i}].old_text must not be empty")
        edits.append((old, new))
    path = call.path(params)
    try:
        original = _read_bytes(path, shown).decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"cannot edit {shown}: not UTF-8 text") from None
    result = apply_edits(original, edits, shown)
    if result == original:
        raise ToolError("no changes made: the replacement(s) produced identical content")
    try:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(result)
    except OSError:
        raise ToolError(f"failed to write file: {shown}") from None
    return {"result": "file edited successfully", "path": shown, "edits_applied": len(edits)}


def _str(desc: str) -> dict[str, str]:
    return {"type": "string", "description": desc}


READ_FILE = Tool(
    "read_file",
    "Read file",
    "Read the contents of a file. Optionally specify a 1-based line range. If append_loc is "
    'true, each line is prefixed with its line number (e.g. "1\u2192...").',
    {
        "path": _str("Path to the file"),
        "start_line": {
            "type": "integer",
            "description": "First line to read, 1-based (default: 1)",
        },
        "end_line": {
            "type": "integer",
            "description": "Last line to read, 1-based inclusive (default: end of file)",
        },
        "append_loc": {"type": "boolean", "description": "Prefix each line with its line number"},
    },
    ("path",),
    run=read_file,
)
WRITE_FILE = Tool(
    "write_file",
    "Write file",
    "Write content to a file, creating it (including parent directories) if it does not "
    "exist. May use with edit_file for more complex edits.",
    {"path": _str("Path of the file to write"), "content": _str("Content to write")},
    ("path", "content"),
    run=write_file,
    permission_write=True,
)
EDIT_FILE = Tool(
    "edit_file",
    "Edit file",
    "Edit a file using exact text replacement. Each edits[].old_text must be unique in the "
    "file and is matched against the original content, not incrementally. Merge nearby "
    "changes into one edit instead of overlapping edits. Use write_file to replace the whole "
    "file.",
    {
        "path": _str("Path to the file to edit"),
        "edits": {
            "type": "array",
            "description": "One or more exact text replacements to apply",
            "items": {
                "type": "object",
                "properties": {
                    "old_text": _str(
                        "Exact text to find; must be unique in the file and must not overlap "
                        "with other edits"
                    ),
                    "new_text": _str("Text to replace old_text with"),
                },
                "required": ["old_text", "new_text"],
            },
        },
    },
    ("path", "edits"),
    run=edit_file,
    permission_write=True,
)
