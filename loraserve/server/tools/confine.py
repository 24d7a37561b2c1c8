"""Where the built-in tools may reach: one root directory (`--tools-root`, default the
server's working directory at start) and everything under it.

A tool's path is resolved the way llama-server resolves it (a leading `~` expanded, a
relative path joined to the request's working directory, `x-tool-cwd`, else the root), then
every symlink on it is followed (`os.path.realpath`) and the result must lie under the
root's own real path. So `..` that climbs out, an absolute path elsewhere and a symlink
that points out are all refused, whatever spelling reaches them; a path that stays inside
is accepted even when absolute. The checked real path is what the tool then opens, so a
link inside the root that points out cannot be followed later by the tool itself (a link
swapped between the check and the open is the one race left, as for any path check).

`exec_shell_command` runs its command with the working directory checked here; what the
command itself does is not confined (it is a shell), which is why it is off unless named.
"""

from __future__ import annotations

import os


class ToolError(Exception):
    """A tool call that failed: its message is the `error` of the answer (status 200, as
    llama-server answers a failed tool so the model can read why)."""


class CwdError(Exception):
    """An `x-tool-cwd` header naming a directory outside the root (a 400: the client's
    request, not the model's call, is wrong)."""


class Confinement:
    """The root the tools are confined to, with symlinks resolved once at start."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(os.path.expanduser(root))

    def contains(self, real: str) -> bool:
        """Whether the real (symlink-free, absolute) path `real` lies under the root."""
        if self.root == os.sep:
            return True
        return real == self.root or real.startswith(self.root + os.sep)

    def workdir(self, header: str | None) -> str:
        """The working directory of one call: `x-tool-cwd` (relative to the root if not
        absolute), else the root. Raises `CwdError` when it is outside the root or is not a
        directory."""
        if not header:
            return self.root
        path = os.path.join(self.root, os.path.expanduser(header))
        real = os.path.realpath(path)
        if not self.contains(real):
            raise CwdError(
                f"x-tool-cwd {header!r} is outside the tools root {self.root} "
                "(set --tools-root to widen it)"
            )
        if not os.path.isdir(real):
            raise CwdError(f"x-tool-cwd {header!r} is not a directory")
        return real

    def resolve(self, path: str, cwd: str) -> str:
        """The real path of a tool's `path` argument, joined to `cwd` when relative; raises
        `ToolError` when it leads outside the root (through `..`, an absolute path or a
        symlink) or holds a NUL byte."""
        if "\0" in path:
            raise ToolError("path holds a NUL byte")
        joined = os.path.join(cwd, os.path.expanduser(path))
        real = os.path.realpath(joined)
        if not self.contains(real):
            raise ToolError(
                f"path {path!r} is outside the tools root {self.root}: paths that leave it "
                "(through '..', an absolute path or a symlink) are refused"
            )
        return real
