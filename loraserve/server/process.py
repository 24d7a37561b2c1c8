"""The server process (`serve`): checks, the bound sockets, uvicorn, the shutdown. Apart from
the app (`app.create_app`; router mode: `router.app.create_router_app`) and imported by
neither, so that router mode never imports torch: its engines run in child processes
(`router.host`), and the router itself then starts in a fraction of a second and holds
no torch (issue 30: ~250 MiB and 3 s before).

`serve` checks the files (headers only) and binds the port first (`startup`); then the
model loads in a background thread while the HTTP server already answers: until the engine
runs, `/health` (and everything else) answers 503 "Loading model". A start-up failure is
one log line and exit status 1. On SIGTERM or SIGINT (Ctrl-C) the server stops accepting
connections, says so, lets in-flight requests finish for up to `SHUTDOWN_GRACE_S` seconds,
cancels what is left, stops the engine and exits with status 0; a second signal exits at
once (status 128 + the signal's number), without tracebacks.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraserve import __version__
from loraserve.server.config.args import ServerConfig
from loraserve.server.errors import ApiError
from loraserve.server.startup import StartupError, bind_all, check_files, check_router_files
from loraserve.server.tools.routes import stop_all
from loraserve.server.vertex import gcp

log = logging.getLogger("loraserve.server")
# uvicorn's HTTP/1.1 implementation, fixed: with `httptools` installed (ray[serve] brings it)
# uvicorn's default writes every header name in lower case, and answers name them as
# llama-server does (`Access-Control-Allow-Origin`, `Process-Start-Time-Unix`); h11 keeps them.
HTTP_IMPL = "h11"
MAX_BODY_BYTES = 32 << 20
SHUTDOWN_GRACE_S = 10.0


class BodyLimitMiddleware:
    """413 for request bodies over `limit` bytes (declared or actually sent)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = ApiError(
            413, "invalid_request_error", f"request body is larger than {self.limit} bytes"
        )
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                if not value.isdigit() or int(value) > self.limit:
                    await too_big.response()(scope, receive, send)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise too_big
            return message

        await self.app(scope, limited, send)


class _Server(uvicorn.Server):
    """uvicorn, minus re-raising the caught SIGTERM/SIGINT after a graceful shutdown (so the
    process exits 0, not killed by the signal). On the first signal it calls `on_exit`; on
    the second it exits the process at once."""

    on_exit: Callable[[], None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:  # the second Ctrl-C: now, with one line and no tracebacks
            log.warning("second %s: exiting now", signal.Signals(sig).name)
            logging.shutdown()
            os._exit(128 + sig)
        super().handle_exit(sig, frame)
        self._captured_signals.clear()
        if self.on_exit is not None:
            self.on_exit()


def _exit_failed() -> None:
    """The model could not load (the loading thread logged why, once): exit status 1."""
    logging.shutdown()
    os._exit(1)


def serve(cfg: ServerConfig) -> None:
    """Run the server until SIGTERM/SIGINT; exits 1, with one log line, if it cannot start
    (bad model or adapter file, busy port, failed load)."""
    if cfg.ignored:
        log.warning("ignored llama-server flags: %s", " ".join(cfg.ignored))
    if cfg.router and gcp.enabled():  # Vertex AI serves one model: the default one here
        cfg = dataclasses.replace(cfg, router=False)
    port = gcp.port_override()
    if port is not None and port != cfg.port:
        log.warning("Vertex AI mode: AIP_HTTP_PORT %d replaces --port %d", port, cfg.port)
        cfg = dataclasses.replace(cfg, port=port)
    try:
        if not cfg.router:  # router mode: each engine's files are checked when it loads
            check_files(cfg)
        else:
            check_router_files(cfg)
        socks = bind_all(cfg.host, cfg.port)
    except StartupError as e:
        log.error("cannot start: %s", e)
        sys.exit(1)
    if cfg.router:
        from loraserve.server.router.app import create_router_app

        app = create_router_app(cfg)
        if not app.state.router.catalog:  # a bare start without the default model installed
            from loraserve.model.default import INSTALL_HINT

            log.warning("router mode (no -m) with no models: %s", " ".join(INSTALL_HINT.split()))
    else:
        import torch

        from loraserve.server.app import create_app

        if cfg.n_threads > 0:
            torch.set_num_threads(cfg.n_threads)
        app = create_app(cfg, on_load_failure=_exit_failed)
    config = uvicorn.Config(
        app,
        http=HTTP_IMPL,
        log_level="warning",
        log_config=None,  # uvicorn's lines go through our root handler (logsink), never blocking
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S) + 2,  # after our own abort below
        access_log=False,
        limit_concurrency=cfg.max_connections or None,  # --max-connections: past it a 503
    )
    server = _Server(config)
    state = app.state.server  # ServerState, or the router (`flights`, `abort_flights`, `loop`)

    def abort_at_grace_end() -> None:  # requests still running then answer 503, not a 500
        def abort() -> None:
            if len(state.flights):
                log.warning("grace period over: cancelling %d requests", len(state.flights))
            state.abort_flights()

        log.warning(
            "shutting down: no new connections; %d requests in flight get up to %g s to "
            "finish (press Ctrl-C again to exit now)",
            len(state.flights),
            SHUTDOWN_GRACE_S,
        )
        if state.loop is not None:
            state.loop.call_soon_threadsafe(stop_all)  # MCP calls in flight end now
            state.loop.call_soon_threadsafe(state.loop.call_later, SHUTDOWN_GRACE_S, abort)

    server.on_exit = abort_at_grace_end
    port = socks[0].getsockname()[1]
    for host in cfg.host.split(","):
        shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
        log.info("loraserve %s listening on http://%s:%d", __version__, shown, port)
    server.run(sockets=socks)
    log.info("stopped")
    # the interpreter's last garbage collection walks every object still alive (seconds
    # with a model and its caches loaded); nothing in those cycles needs finalizing
    gc.freeze()
