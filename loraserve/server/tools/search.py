"""The search tools: `file_glob_search` and `grep_search` (llama-server's definitions,
limits and answers; server-tools.cpp), over the listings of `listing.py`."""

from __future__ import annotations

import os
import re
from typing import Any

from loraserve.server.tools.builtin import Call, Tool, bool_param, int_param
from loraserve.server.tools.builtin import str_param as text
from loraserve.server.tools.confine import ToolError
from loraserve.server.tools.listing import list_entries, path_glob_match

GLOB_MAX_RESULTS = 100
GREP_MAX_RESULTS = 100
_TYPES = ("file", "dir", "all")


def file_glob_search(params: dict[str, Any], call: Call) -> dict[str, Any]:
    """Entries under `path` matching `include` and not `exclude`, at most `limit`."""
    shown = text(params, "path")
    base = call.path(params)
    include = text(params, "include", "**")
    exclude = text(params, "exclude", "")
    kind = text(params, "type", "file")
    max_depth = max(0, int_param(params, "max_depth", 0))
    limit = int_param(params, "limit", GLOB_MAX_RESULTS)
    if limit < 1:
        raise ToolError(f"invalid limit: {limit} (expected 1 or more)")
    limit = min(limit, GLOB_MAX_RESULTS)
    if kind not in _TYPES:
        raise ToolError(f'invalid type: {kind} (expected "file", "dir" or "all")')
    if not os.path.isdir(base):
        raise ToolError(f"path does not exist or is not a directory: {shown}")
    listing = list_entries(base, max_depth, kind, call.conf)
    matches = [
        (rel, is_dir)
        for rel, is_dir in listing.entries
        if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))
    ]
    shown_matches = matches[:limit]
    lines = [rel + ("/" if is_dir else "") for rel, is_dir in shown_matches]
    out = "".join(line + "\n" for line in lines) + f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > limit:
        out += (
            f"[{limit} results limit reached ({len(matches)} total matches). "
            "Refine the glob pattern to narrow the search.]\n"
        )
    if listing.truncated:
        out += "[results truncated: time budget or unreadable directory]\n"
    entries = [{"path": r, "type": "dir" if d else "file"} for r, d in shown_matches]
    return {"plain_text_response": out, "entries": entries, "base": base}


def _pattern(params: dict[str, Any]) -> re.Pattern[str]:
    source = text(params, "pattern")
    if bool_param(params, "literal"):
        source = re.escape(source)
    try:
        return re.compile(source, re.IGNORECASE if bool_param(params, "ignore_case") else 0)
    except re.error as e:
        raise ToolError(f"invalid regex: {e}") from None


def grep_search(params: dict[str, Any], call: Call) -> dict[str, Any]:
    """Lines matching `pattern` in a file, or in the files under a directory."""
    shown = text(params, "path")
    include = text(params, "include", "**")
    exclude = text(params, "exclude", "")
    numbered = bool_param(params, "return_line_numbers")
    context = max(0, int_param(params, "context_lines", 0))
    pattern = _pattern(params)
    target = call.path(params)
    if os.path.isfile(target):
        files = [(target, shown)]
    elif os.path.isdir(target):
        files = [
            (os.path.join(target, rel), rel)
            for rel, _ in list_entries(target, 0, "file", call.conf).entries
            if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))
        ]
    else:
        raise ToolError(f"path does not exist: {shown}")
    out: list[str] = []
    total, cut = 0, False
    show_num = numbered or context > 0
    for full, display in files:
        if cut:
            break
        real = os.path.realpath(full)
        if not call.conf.contains(real):
            continue
        try:
            with open(real, "rb") as f:
                lines = f.read().decode("utf-8", "replace").split("\n")
        except OSError:
            continue
        if lines and lines[-1] == "":
            lines.pop()
        for i, line in enumerate(lines):
            if total >= GREP_MAX_RESULTS:
                cut = True
                break
            if not pattern.search(line):
                continue
            lo, hi = max(0, i - context), min(len(lines) - 1, i + context)
            for j in range(lo, hi + 1):
                mark = ":" if j == i else "-"
                num = f"{j + 1}{mark}" if show_num else ""
                out.append(f"{display}{mark}{num}{lines[j]}\n")
            if context > 0:
                out.append("--\n")
            total += 1
    result = "".join(out) + f"\n---\nTotal matches: {total}\n"
    if cut:
        result += (
            f"[{GREP_MAX_RESULTS} matches limit reached. "
            "Narrow the path/pattern/include to see more.]\n"
        )
    return {"plain_text_response": result}


def _s(desc: str) -> dict[str, str]:
    return {"type": "string", "description": desc}


def _typed(kind: str, desc: str) -> dict[str, str]:
    return {"type": kind, "description": desc}


FILE_GLOB_SEARCH = Tool(
    "file_glob_search",
    "File search",
    "Recursively search for files matching a glob pattern under a directory. Automatically "
    "skips files ignored by .gitignore (when the directory is inside a git repo) and common "
    "junk directories (.git, node_modules, build, dist, etc.) otherwise. A pattern with no "
    "'/' (e.g. \"*.cpp\") matches the file's basename at any depth. A pattern containing '/' "
    "matches the full relative path; unless already anchored with \"**/\" or a leading '/', "
    'it is automatically prefixed with "**/". Use type="dir" or "all" to also list '
    "directories; directory entries are suffixed with '/' in the output. Note: directory "
    "listings do not apply .gitignore filtering.",
    {
        "path": _s("Base directory to search in"),
        "include": _s(
            'Glob pattern for files to include (e.g. "*.cpp" or "src/**/*.cpp"). Default: **'
        ),
        "exclude": _s("Glob pattern for files to exclude"),
        "type": _s('Entry type to return: "file" (default), "dir" or "all"'),
        "max_depth": _typed(
            "integer",
            "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = direct "
            "children only)",
        ),
        "limit": _typed(
            "integer",
            f"Maximum number of results to return, capped at {GLOB_MAX_RESULTS} "
            f"(default {GLOB_MAX_RESULTS})",
        ),
    },
    ("path",),
    run=file_glob_search,
)
GREP_SEARCH = Tool(
    "grep_search",
    "Grep search",
    "Search for a pattern in files under a path. Returns matching lines with file paths (and, "
    "unless searching a single file, paths relative to the given directory). Automatically "
    "skips files ignored by .gitignore (when the directory is inside a git repo) and common "
    "junk directories (.git, node_modules, build, dist, etc.) otherwise. include/exclude: a "
    "pattern with no '/' matches the basename at any depth; a pattern containing '/' matches "
    'the full relative path (auto-anchored with "**/" unless already anchored).',
    {
        "path": _s("File or directory to search in"),
        "pattern": _s("Pattern to search for (regular expression unless literal is true)"),
        "include": _s("Glob pattern to filter files (default: **)"),
        "exclude": _s("Glob pattern to exclude files"),
        "return_line_numbers": _typed("boolean", "If true, include line numbers in results"),
        "literal": _typed(
            "boolean",
            "Treat pattern as a literal string instead of a regular expression (default: false)",
        ),
        "ignore_case": _typed("boolean", "Case-insensitive search (default: false)"),
        "context_lines": _typed(
            "integer",
            "Number of lines of context to show before and after each match (default: 0)",
        ),
    },
    ("path", "pattern"),
    run=grep_search,
)
