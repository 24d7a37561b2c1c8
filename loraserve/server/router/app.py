"""Router mode (`loraserve` without `-m`; `--models-dir` / `--models-preset` /
`--models-max` / `--[no-]models-autoload`): llama-server's router API over the engines of
`pool` and the catalogue of `presets` (the default model's entry included).

Own routes: `GET /health` (the router's; `?model=` asks that model's engine), `GET /props`
(the router's `role: router` object; `?model=` forwards), `GET /models` and `/v1/models`
(every model id with its `status`; `?reload=1` re-reads the sources), `POST /models/load`,
`POST /models/unload`, `GET /models/sse` (status changes, `router.events`), `POST /models`
(a download into the cache) and `DELETE /models` (its files deleted; `router.downloads`).
Every other API route is forwarded, in-process (`router.forward`), to the engine of the model
its JSON body's `model` (GET: the `model` query parameter) names (none: the only model, when the
catalogue has one, else, ours, for the README's plain `loraserve`, the default model when
neither `--models-dir` nor `--models-preset` is given: `Router.implicit`), loading it first unless
`--no-models-autoload` (or `?autoload=false`); the body gets that preset's adapter mix and
sampling defaults (`Preset.inject`). Errors and status codes are llama-server's
(tools/server/server-models.cpp, `router_validate_model` and the `/models` handlers).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route

from loraserve import __version__
from loraserve.server import offload, webui
from loraserve.server.auth import ApiKeyMiddleware
from loraserve.server.config.args import ServerConfig
from loraserve.server.cors import CorsMiddleware, cors_policy
from loraserve.server.errors import install_error_handlers
from loraserve.server.process import BodyLimitMiddleware
from loraserve.server.router import downloads, routes
from loraserve.server.router.engine import Engine, base_of
from loraserve.server.router.events import ModelEvents
from loraserve.server.router.forward import FORWARDED_METHODS, Forward
from loraserve.server.router.pending import Pending
from loraserve.server.router.pool import Pool
from loraserve.server.router.presets import Preset, default_model_entry, load_catalog
from loraserve.server.tools.routes import ToolsMiddleware


class Router:
    """The catalogue (model id -> `Preset`) and the engine pool behind the router's routes."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.pool = Pool(cfg.models_max)
        self.catalog: dict[str, Preset] = load_catalog(cfg)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.events = ModelEvents()  # GET /models/sse
        self.downloads = downloads.Downloads(self)  # POST /models, DELETE /models
        self.pending = Pending(self)  # presets whose hf-repo is not in the cache yet
        self.pool.on_status = self._status_changed
        self.pool.bases = lambda: {base_of(p.key) for p in self.catalog.values() if p.key}

    def _status_changed(self, eng: Engine) -> None:
        """Every preset served by `eng` changed status with it (`/models/sse`)."""
        data: dict[str, Any] = {"status": eng.status}
        if eng.status == "unloaded":
            data["exit_code"] = 1 if eng.failed else 0
        for preset in self.catalog.values():
            if preset.key == eng.cfg:
                self.events.publish(preset.name, "status_change", data)

    def find(self, name: str) -> Preset | None:
        """The preset `name` names (exactly, else ignoring case)."""
        if name in self.catalog:
            return self.catalog[name]
        folded = {k.casefold(): p for k, p in self.catalog.items()}
        return folded.get(name.casefold())

    def implicit(self) -> str:
        """The model a request naming none goes to ('' for llama-server's 400): the only
        one; ours: else the default model on a plain `loraserve` (models in the download
        cache are listed beside it there, as llama-server lists them)."""
        if len(self.catalog) == 1:
            return next(iter(self.catalog))
        default = default_model_entry()
        plain = not self.cfg.models_dir and not self.cfg.models_preset
        if plain and default is not None and default[0] in self.catalog:
            return default[0]
        return ""

    def engine_of(self, preset: Preset) -> Engine | None:
        return None if preset.key is None else self.pool.engine(preset.key)

    def running(self, preset: Preset) -> bool:
        eng = self.engine_of(preset)
        return eng is not None and eng.running

    async def reload(self) -> None:
        """Re-read the sources; running engines no preset uses any more are unloaded."""
        self.catalog = load_catalog(self.cfg)
        keys = {p.key for p in self.catalog.values()}
        for cfg, eng in list(self.pool.engines.items()):
            if cfg not in keys:
                if eng.running:
                    await self.pool.unload(eng, timeout=0.0)
                del self.pool.engines[cfg]
        self.events.publish("*", "models_reload")

    # --- what serve() needs of app.state.server ---
    @property
    def flights(self) -> range:
        """As many items as requests in flight over all engines (`serve` counts them)."""
        return range(sum(e.busy for e in self.pool.engines.values()))

    def abort_flights(self, message: str = "the server is shutting down") -> None:
        """Event loop: every engine ends its requests in flight now (in its process)."""
        assert self.loop is not None
        for eng in self.pool.engines.values():
            if eng.host is not None and eng.busy:
                self.loop.create_task(eng.host.abort(eng.eid, message))

    # --- answers ---
    def props(self) -> dict[str, Any]:
        """`GET /props` of the router itself (llama-server's `get_router_props`)."""
        return {
            "role": "router",
            "max_instances": self.cfg.models_max,
            "models_autoload": self.cfg.models_autoload,
            "model_alias": "loraserve",
            "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
            "ui_settings": {},
            "build_info": f"b0-loraserve-{__version__}",  # llama-server's b<build>-<commit>
            "cors_proxy_enabled": self.cfg.tools.ui_mcp_proxy,
        }

    async def model_entry(self, preset: Preset, created: int) -> dict[str, Any]:
        """One `GET /models` item, as llama-server's `get_router_models` writes it."""
        eng = self.engine_of(preset)
        status: dict[str, Any] = {"value": eng.status if eng else "unloaded", "args": preset.args}
        if preset.source == "preset":
            status["preset"] = preset.ini
        if preset.error is not None or (eng is not None and eng.failed):
            status.update(failed=True, exit_code=1, error=preset.error or (eng and eng.error))
        status.update(self.pending.status(preset.name))
        entry: dict[str, Any] = {
            "id": preset.name,
            "aliases": [],
            "tags": [],
            "object": "model",
            "owned_by": "llamacpp",
            "created": created,
            "status": status,
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "source": preset.source,
            "can_remove": preset.removable,
        }
        if eng is not None and eng.status == "loaded" and eng.meta is not None:
            # the engine's model sizes, from its load: the engine's own `/v1/models` lists
            # the adapters on its engine thread, and a public list must not wait for a step
            entry["meta"] = dict(eng.meta)
        return entry


def create_router_app(cfg: ServerConfig) -> Starlette:
    """The router's HTTP app (see the module docstring): Starlette alone, no FastAPI (whose
    import was ~0.35 s of the router's start; the router validates no body with pydantic)."""
    router = Router(cfg)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        router.loop = asyncio.get_running_loop()
        offload.install(router.loop)
        # an engine process starts now, in the background (a first load takes it, so it
        # waits for no interpreter start once it is up); the router answers meanwhile, as
        # llama-server's does at once
        router.pool.start_spare()
        for preset in router.catalog.values():
            if preset.load_on_startup and preset.key is not None:
                router.pool.start_load(preset.key)
            elif preset.load_on_startup and preset.hf is not None:
                router.pending.start_soon(preset)
        try:
            yield
        finally:
            for name in list(router.downloads.tasks):
                await router.downloads.cancel(name)
            for name in list(router.pending.tasks):
                await router.pending.cancel(name)
            router.events.close()
            await router.pool.close_all()

    forward = Forward(router)
    app = Starlette(
        routes=[
            *downloads.routes(router.downloads),
            *routes.routes(router, forward),
            *webui.routes,
            Route("/{path:path}", endpoint=forward, methods=FORWARDED_METHODS),
        ],
        lifespan=lifespan,
    )
    app.state.server = router
    app.state.router = router
    install_error_handlers(app)
    app.add_middleware(ToolsMiddleware, cfg=cfg)  # /tools, /cors-proxy: not forwarded
    app.add_middleware(BodyLimitMiddleware)
    if cfg.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=cfg.api_keys)
    app.add_middleware(CorsMiddleware, policy=cors_policy(cfg))
    return app
