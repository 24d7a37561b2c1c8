"""`--sleep-idle-seconds N`: the server sleeps after N seconds without work, as
llama-server reports it (`GET /props` `is_sleeping`), and the next request that does work
wakes it; read-only requests (health, props, the model list, metrics, slots) and CORS
preflights neither count as work nor wake it.

**ours:** sleeping releases nothing: the model and the prefix cache stay in memory (what
llama-server's sleep saves, a reload, is what we avoid), so waking costs nothing either.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Receive, Scope, Send

READ_ONLY = frozenset(
    {"/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics", "/slots"}
)


class SleepWatch:
    """Counts requests doing work and when the last one ended (`seconds` < 0: never
    sleeps)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.active = 0
        self.last = time.monotonic()

    @property
    def sleeping(self) -> bool:
        """Whether the server has been idle for `seconds` (and nothing runs)."""
        return (
            self.seconds >= 0 and not self.active and time.monotonic() - self.last >= self.seconds
        )

    @staticmethod
    def wakes(scope: Scope) -> bool:
        """Whether a request counts as work."""
        method = scope.get("method", "GET")
        if method == "OPTIONS" or (method in ("GET", "HEAD") and scope["path"] in READ_ONLY):
            return False
        return True


class SleepMiddleware:
    """Keeps a `SleepWatch` up to date around every request that does work."""

    def __init__(self, app: ASGIApp, watch: SleepWatch) -> None:
        self.app = app
        self.watch = watch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.watch.wakes(scope):
            await self.app(scope, receive, send)
            return
        self.watch.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.watch.active -= 1
            self.watch.last = time.monotonic()
