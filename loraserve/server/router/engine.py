"""One hosted engine of the router (`Engine`: its configuration, its status as llama-server
words it, who uses it and where it runs) and the key of the host process it runs in
(`base_of`). The pool (`router.pool`) owns their lifecycle: loading, the `--models-max`
queue, unloading."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from loraserve.server.config.args import ServerConfig
from loraserve.server.router.hosts import Host, ProxyApp


def base_of(cfg: ServerConfig) -> tuple[str, str]:
    """The host key of an engine configuration: its model file and weights' type."""
    return (str(cfg.model), cfg.dtype)


@dataclass
class Engine:
    """One hosted engine and its lifecycle: status `unloaded` / `loading` / `loaded`
    (llama-server's words); `failed` with `error` after a load that did not go through or
    a process that died."""

    cfg: ServerConfig
    status: str = "unloaded"
    app: ProxyApp | None = None
    error: str | None = None
    failed: bool = False
    last_used: float = 0.0
    busy: int = 0  # requests being served now (never evicted meanwhile)
    waiting: int = 0  # requests waiting to be served (not evicted either: router.forward)
    placed: bool = False  # holds one of the `--models-max` places (loading past the queue)
    pinned: bool = False  # asked by /models/load or load-on-startup: never dropped queued
    host: Host | None = None  # the process it runs in, once loading there
    eid: str = ""  # its id in that process
    meta: dict[str, int] | None = None  # its model's sizes, for `GET /models`
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded")

    def touch(self) -> None:
        self.last_used = time.monotonic()

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[ProxyApp]:
        """The app, held busy (not evicted) while the caller serves a request with it."""
        assert self.app is not None
        self.busy += 1
        self.touch()
        try:
            yield self.app
        finally:
            self.busy -= 1
            self.touch()
