"""The ASGI app (`create_app`) and the process around it (`serve`).

The model loads in a background thread while the HTTP server already answers: until
the engine runs, `/health` (and everything else) answers 503 "Loading model". On
SIGTERM or SIGINT the server stops accepting connections, lets in-flight requests
finish for up to `SHUTDOWN_GRACE_S` seconds, cancels what is left, stops the engine and
exits with status 0.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import FrameType

import torch
import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraserve import __version__
from loraserve.engine.engine import Engine, EngineConfig
from loraserve.model.loader import LoadedModel
from loraserve.server import admin, completion, embeddings, lora_api, metrics, oai, webui
from loraserve.server.args import ServerConfig
from loraserve.server.auth import ApiKeyMiddleware
from loraserve.server.cors import CorsMiddleware, cors_policy
from loraserve.server.errors import ApiError, JsonResponse, install_error_handlers
from loraserve.server.state import ServerState

log = logging.getLogger("loraserve.server")
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


def build_engine(cfg: ServerConfig, model: LoadedModel) -> Engine:
    """The engine sized by the command line (`-np`, `-c`, `-ub`, `--cache-ram`)."""
    n_ctx = cfg.n_ctx or model.config.context_length
    return Engine(
        model,
        EngineConfig(
            n_slots=cfg.n_parallel,
            n_ctx=max(n_ctx, cfg.n_parallel),
            ubatch=cfg.n_ubatch,
            cache_ram_mib=cfg.cache_ram_mib,
        ),
    )


def load_from_config(cfg: ServerConfig) -> LoadedModel:
    """Load `-m` (or the default model) in the precision of `--dtype`."""
    from loraserve.model.default import resolve_model_path
    from loraserve.model.loader import load_model

    path = resolve_model_path(cfg.model)
    return load_model(path, "float32" if cfg.dtype == "float32" else "native")


def _start(
    state: ServerState,
    model: LoadedModel | None,
    loader: Callable[[], LoadedModel],
    on_failure: Callable[[], None],
) -> None:
    cfg = state.cfg
    try:
        if model is None:
            model = loader()
        engine = build_engine(cfg, model)
        specs = [
            (spec.path, 0.0 if cfg.lora_init_without_apply else spec.scale) for spec in cfg.lora
        ]
        if cfg.model is None and not cfg.lora:  # the default model: its demo adapters, off
            from loraserve.adapters import DEMO_ADAPTERS, gguf_path

            specs = [(str(gguf_path(name)), 0.0) for name in DEMO_ADAPTERS]
        for path, scale in specs:
            adapter = engine.load_adapter(path, scale).result()
            log.info("adapter %d: %s (%s) at scale %g", adapter.id, adapter.name, path, scale)
        engine.start()
        state.attach(model, engine)
        log.info(
            "model %s ready: %d slots of %d tokens", model.name, cfg.n_parallel, engine.n_ctx_slot
        )
    except BaseException as e:  # SystemExit from a missing model included
        state.load_error = str(e) or type(e).__name__
        log.error("cannot start: %s", state.load_error)
        on_failure()


def create_app(
    cfg: ServerConfig,
    model: LoadedModel | None = None,
    *,
    loader: Callable[[], LoadedModel] | None = None,
    on_load_failure: Callable[[], None] = lambda: None,
) -> FastAPI:
    """The HTTP app. With `model`, it serves that model; else `loader` (default: `-m`
    from `cfg`) runs in a background thread at start-up and the app answers 503 until it
    returns. `on_load_failure` is called (from that thread) if loading fails."""
    state = ServerState(cfg)
    stats = metrics.Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.loop = asyncio.get_running_loop()
        thread = threading.Thread(
            target=_start,
            args=(state, model, loader or (lambda: load_from_config(cfg)), on_load_failure),
            name="loraserve-load",
            daemon=True,
        )
        thread.start()
        try:
            yield
        finally:
            state.shutdown()

    app = FastAPI(
        title="loraserve",
        version=__version__,
        lifespan=lifespan,
        default_response_class=JsonResponse,
        docs_url=None,
        redoc_url=None,
    )
    app.state.server = state
    app.state.metrics = stats
    state.listeners.append(stats.listener)
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware)
    if cfg.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=cfg.api_keys)
    app.add_middleware(CorsMiddleware, policy=cors_policy(cfg))  # outermost: preflights
    for module in (completion, oai, admin, lora_api, metrics, embeddings, webui):
        app.include_router(module.router)
    return app


class _Server(uvicorn.Server):
    """uvicorn, minus re-raising the caught SIGTERM/SIGINT after a graceful shutdown (so the
    process exits 0, not killed by the signal). On the first signal it calls `on_exit`."""

    on_exit: Callable[[], None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        self._captured_signals.clear()
        if first and self.on_exit is not None:
            self.on_exit()


def serve(cfg: ServerConfig) -> None:
    """Run the server until SIGTERM/SIGINT; exits 1 if the model cannot be loaded."""
    if cfg.ignored:
        log.warning("ignored llama-server flags: %s", " ".join(cfg.ignored))
    if cfg.n_threads > 0:
        torch.set_num_threads(cfg.n_threads)
    server: _Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(cfg, on_load_failure=stop)
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level="info",
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S) + 2,  # after our own abort below
        access_log=False,
    )
    server = _Server(config)
    state: ServerState = app.state.server

    def abort_at_grace_end() -> None:  # requests still running then answer 503, not a 500
        if state.loop is not None:
            state.loop.call_soon_threadsafe(
                state.loop.call_later, SHUTDOWN_GRACE_S, state.abort_flights
            )

    server.on_exit = abort_at_grace_end
    log.info("loraserve %s listening on http://%s:%d", __version__, cfg.host, cfg.port)
    server.run()
    if app.state.server.load_error is not None:
        sys.exit(1)
