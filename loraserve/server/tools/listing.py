"""Directory listings and glob patterns of the search tools, as llama-server makes them
(tools/server/server-tools.cpp `list_entries`, `path_glob_match`; common/common.cpp
`glob_match`).

Files come from `git ls-files --cached --others --exclude-standard` when the directory is
inside a git work tree (so `.gitignore` applies), else from a walk that lists but never
enters the junk directories (`.git`, `node_modules`, `build`, ...) nor follows a link to a
directory. Every entry is checked against the `Confinement`: a link that leads out of the
tools root is left out of the listing.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from functools import cache, lru_cache

from loraserve.server.tools.confine import Confinement

JUNK_DIRS = frozenset(
    (".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build")
    + ("target", ".cache", ".idea", ".vscode")
)
LIST_TIMEOUT_S = 15.0  # budget of one listing, git and walk together
GIT_MAX_OUTPUT = 8 << 20


def _class_match(c: str, cls: str) -> bool:
    negated = cls.startswith("!")
    if negated:
        cls = cls[1:]
    if cls[:1] in ("]", "-"):
        if c == cls[0]:
            return not negated
        cls = cls[1:]
    i, matched = 0, False
    while i < len(cls):
        if i + 2 < len(cls) and cls[i + 1] == "-":
            if cls[i] <= c <= cls[i + 2]:
                matched = True
                break
            i += 3
        else:
            if cls[i] == c:
                matched = True
                break
            i += 1
    return matched != negated


@lru_cache(maxsize=4096)
def glob_match(pattern: str, text: str) -> bool:
    """llama.cpp's glob: `**` crosses `/`, `*` and `?` do not, `[...]` / `[!...]` classes."""

    @cache
    def m(p: int, s: int) -> bool:
        if p == len(pattern):
            return s == len(text)
        if pattern.startswith("**", p):
            return m(p + 2, s) or (s < len(text) and m(p, s + 1))
        ch = pattern[p]
        if ch == "*":
            k = s
            while k < len(text) and text[k] != "/":
                if m(p + 1, k):
                    return True
                k += 1
            return m(p + 1, k)
        if ch == "?":
            return s < len(text) and text[s] != "/" and m(p + 1, s + 1)
        if ch == "[":
            end = p + 1
            if end < len(pattern) and pattern[end] in "]-":
                end += 1
            while end < len(pattern) and pattern[end] != "]":
                end += 1
            if end < len(pattern):
                return (
                    s < len(text)
                    and _class_match(text[s], pattern[p + 1 : end])
                    and m(end + 1, s + 1)
                )
            return s < len(text) and text[s] == "[" and m(p + 1, s + 1)
        return s < len(text) and text[s] == ch and m(p + 1, s + 1)

    return m(0, 0)


def path_glob_match(pattern: str, rel: str) -> bool:
    """A pattern without `/` matches the basename at any depth; one with `/` the whole
    relative path, anchored with `**/` unless it starts with `**` or `/`."""
    if "/" not in pattern:
        return glob_match(pattern, rel.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob_match(pattern, rel)
    return glob_match("**/" + pattern, rel)


@dataclass
class Listing:
    """Entries relative to the base (`/`-separated, `is_dir`), and whether the walk was cut."""

    entries: list[tuple[str, bool]] = field(default_factory=list)
    truncated: bool = False


def _depth(rel: str) -> int:
    return 1 + rel.count("/")


def _git_files(base: str, max_depth: int, conf: Confinement) -> list[tuple[str, bool]] | None:
    try:
        out = subprocess.run(
            ["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            timeout=LIST_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    entries = []
    for line in out.stdout[:GIT_MAX_OUTPUT].decode("utf-8", "replace").splitlines():
        line = line.rstrip("\r").replace("\\", "/")
        if not line or (max_depth > 0 and _depth(line) > max_depth):
            continue
        full = os.path.join(base, line)
        if os.path.isfile(full) and conf.contains(os.path.realpath(full)):
            entries.append((line, False))
    return entries


def list_entries(base: str, max_depth: int, kind: str, conf: Confinement) -> Listing:
    """The entries under `base` (a real directory inside the root) of `kind` ("file",
    "dir" or "all"); `max_depth` 0 is unlimited, 1 the direct children only."""
    out = Listing()
    if kind == "file":
        files = _git_files(base, max_depth, conf)
        if files is not None:
            out.entries = files
            return out
    deadline = time.monotonic() + LIST_TIMEOUT_S
    stack: list[tuple[str, str, int]] = [(base, "", 0)]
    while stack:
        directory, rel_dir, depth = stack.pop()
        try:
            with os.scandir(directory) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError:
            out.truncated = True
            continue
        for entry in children:
            if time.monotonic() > deadline:
                out.truncated = True
                return out
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            link = entry.is_symlink()
            if link and not conf.contains(os.path.realpath(entry.path)):
                continue  # a link out of the root is neither listed nor followed
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
            except OSError:
                continue
            if is_dir:
                if kind in ("dir", "all"):
                    out.entries.append((rel, True))
                if entry.name.lower() in JUNK_DIRS or link:
                    continue
                if max_depth == 0 or depth + 1 < max_depth:
                    stack.append((entry.path, rel, depth + 1))
            elif is_file and kind in ("file", "all"):
                out.entries.append((rel, False))
    return out
