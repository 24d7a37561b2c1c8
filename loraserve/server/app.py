"""The ASGI app of one model (`create_app`): its engine loads in a background thread while
the app already answers (503 "Loading model" until it runs). The process around it,
`serve`, is `process.py` (re-exported here with its constants for importers)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from loraserve import __version__
from loraserve.model.loader import LoadedModel
from loraserve.server import offload, webui
from loraserve.server.anthropic import messages as anthropic
from loraserve.server.auth import ApiKeyMiddleware
from loraserve.server.compat import sglang, vllm
from loraserve.server.config.args import ServerConfig
from loraserve.server.cors import CorsMiddleware, cors_policy
from loraserve.server.errors import ApiError, JsonResponse, install_error_handlers
from loraserve.server.native import admin, completion, embeddings, lora_api, metrics, slots
from loraserve.server.openai import endpoints as oai
from loraserve.server.openai import responses, token_count

# the process around the app (`process.py`), re-exported for the tests and the cluster
from loraserve.server.process import HTTP_IMPL as HTTP_IMPL
from loraserve.server.process import MAX_BODY_BYTES as MAX_BODY_BYTES
from loraserve.server.process import BodyLimitMiddleware
from loraserve.server.process import serve as serve
from loraserve.server.sleep import SleepMiddleware, SleepWatch
from loraserve.server.startup import (
    load_from_config,
    start,
)
from loraserve.server.state import ServerState
from loraserve.server.tools.routes import ToolsMiddleware
from loraserve.server.vertex import gcp

log = logging.getLogger("loraserve.server")


class HealthFastPath:
    """`GET /health` (and `/v1/health`) answered here, before the other middlewares and the
    router: the answer is the route's (`native.admin.health`: ok, or 503 while loading), a
    public, read-only path (no API key, no wake-up, no body), so skipping them changes
    nothing but the time: a tenth of the Python the full stack runs, which counts when the
    event loop shares the GIL with busy threads (issue 31: `/health` under load)."""

    OK = JsonResponse({"status": "ok"})
    PATHS = frozenset({"/health", "/v1/health"})

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] not in self.PATHS:
            await self.app(scope, receive, send)
            return
        try:
            self.state.require()
        except ApiError as e:
            await e.response()(scope, receive, send)
            return
        await self.OK(scope, receive, send)


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
        offload.install(state.loop)
        thread = threading.Thread(
            target=start,
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
    app.state.sleep = SleepWatch(cfg.sleep_idle_seconds)
    state.listeners.append(stats.listener)
    install_error_handlers(app)
    app.add_middleware(ToolsMiddleware, cfg=cfg)  # /tools, /cors-proxy: inside the API key
    app.add_middleware(BodyLimitMiddleware)
    if cfg.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=cfg.api_keys)
    app.add_middleware(SleepMiddleware, watch=app.state.sleep)
    app.add_middleware(HealthFastPath, state=state)  # inside CORS: its headers still apply
    app.add_middleware(CorsMiddleware, policy=cors_policy(cfg))  # outermost: preflights
    routes = (completion, oai, anthropic, responses, admin, slots, lora_api, metrics, embeddings)
    for module in (*routes, vllm, sglang, token_count, webui):
        app.include_router(module.router)
    gcp.install(app)  # Vertex AI's /predict, with AIP_MODE=PREDICTION
    return app
