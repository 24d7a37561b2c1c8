"""Tool runtimes (`--tools-runtime`, the `x-tool-runtime` header): the values llama-server
accepts, parsed and checked as it checks them (server-tools.cpp `container_runtime_spec`,
`tools_io_ssh::is_valid_target`, `make_tools_io`):

- `docker:<image>`, `podman:<image>`: a container spawned for the server's tools;
- `docker-container:<id>`, `podman-container:<id>`: an existing container;
- `ssh:<target>`: a remote POSIX host.

loraserve runs its tools on the host only, confined to `--tools-root`. A runtime value is
therefore refused with a clear message: an unknown scheme, an id or target that would be
read as an option (`--privileged`, `-oProxyCommand=...`), a client program (docker, podman,
ssh) that is not installed, and otherwise the fact that loraserve does not run tools there.
Nothing ever falls back to the host when a runtime was asked for.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SSH_TARGET = re.compile(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*")


class RuntimeSpecError(ValueError):
    """A runtime value that cannot be used; its message says why."""


@dataclass(frozen=True)
class RuntimeSpec:
    """A parsed runtime: the client program, its argument (image, container id or ssh
    target) and whether it attaches to something that already exists."""

    program: str
    arg: str
    attach: bool


def parse_runtime(spec: str) -> RuntimeSpec:
    """The runtime `spec` names; raises `RuntimeSpecError` with llama-server's wording for
    an unknown scheme, a container id or an ssh target that is not allowed."""
    for program in ("docker", "podman"):
        for prefix, attach in ((f"{program}-container:", True), (f"{program}:", False)):
            if spec.startswith(prefix):
                arg = spec[len(prefix) :]
                if attach and not _ID.fullmatch(arg):
                    raise RuntimeSpecError(f"invalid container id: {arg}")
                if not attach and not arg:
                    raise RuntimeSpecError(
                        f"--tools-runtime {program}:<image> requires an image name"
                    )
                return RuntimeSpec(program, arg, attach)
    if spec.startswith("ssh:"):
        target = spec[len("ssh:") :]
        if not _SSH_TARGET.fullmatch(target):
            raise RuntimeSpecError(f"invalid ssh target: {target}")
        return RuntimeSpec("ssh", target, True)
    raise RuntimeSpecError(f"unknown tool runtime: {spec}")


def check_runtime(spec: str) -> RuntimeSpec:
    """`parse_runtime`, then whether loraserve can use it: raises `RuntimeSpecError`
    naming the missing program, or saying that loraserve runs tools on the host only."""
    parsed = parse_runtime(spec)
    if shutil.which(parsed.program) is None:
        raise RuntimeSpecError(
            f"tool runtime {spec!r} is not available: {parsed.program} is not installed"
        )
    raise RuntimeSpecError(
        f"tool runtime {spec!r} is not available: loraserve runs its tools on the host only, "
        "confined to --tools-root"
    )
