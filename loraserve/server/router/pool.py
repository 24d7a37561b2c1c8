"""The router's engines: one whole loraserve app (`create_app`: its own engine, KV pool,
adapters and chat template) per engine configuration, hosted in the router's process and
event loop, loaded on demand and unloaded least-recently-used past `--models-max`.

In-process rather than llama-server's child processes: presets over one base must share one
engine (one copy of the weights, one KV pool) whatever process hosts it, an in-process engine
costs no second Python interpreter and torch runtime (hundreds of MiB per child) and no extra
hop per request, and every failure we can meet while loading (a broken file, a model that
does not fit) is an exception caught here, reported in `GET /models`, never the router's end.
Engines over the same file with different settings (context, template) still share the
weights: loaded models are kept by path while any engine uses them.

The queue, as llama-server's router (llama.cpp's `test_router_queue_*`): an engine past
`--models-max` waits for room (status `loading`, holding no place) in arrival order; room is
made by unloading the least-recently-used engine that nobody uses, a request being served
or waiting to be (`busy`, `waiting`) counting as a use; requests for one engine share its
load; a load that requests started is dropped while it still waits for room once none of
them waits any more (their clients left), so a client that gives up costs no running model
its place. `POST /models/load` and `load-on-startup` loads are kept (`pinned`).
`LLAMA_SERVER_DEBUG_FAKE_TIMING` (set by llama.cpp's test suite) adds llama-server's debug
delays: 2 s before a load takes its place, 2 s after a request is counted busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI

from loraserve.model.loader import LoadedModel
from loraserve.server.config.args import ServerConfig
from loraserve.server.offload import io_thread

log = logging.getLogger("loraserve.router")
POLL_S = 0.02
FAKE_TIMING_S = 2.0  # llama-server's (server-models.cpp, `debug_fake_timing`)


@dataclass
class Engine:
    """One hosted engine app and its lifecycle: status `unloaded` / `loading` / `loaded`
    (llama-server's words); `failed` with `error` after a load that did not go through."""

    cfg: ServerConfig
    status: str = "unloaded"
    app: FastAPI | None = None
    error: str | None = None
    failed: bool = False
    last_used: float = 0.0
    busy: int = 0  # requests being served now (never evicted meanwhile)
    waiting: int = 0  # requests waiting to be served (not evicted either: router.forward)
    placed: bool = False  # holds one of the `--models-max` places (loading past the queue)
    pinned: bool = False  # asked by /models/load or load-on-startup: never dropped queued
    holds_model: bool = False  # counted in the pool's shared weights
    _life: AbstractAsyncContextManager[None] | None = field(default=None, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded")

    def touch(self) -> None:
        self.last_used = time.monotonic()

    @asynccontextmanager
    async def use(self) -> AsyncIterator[FastAPI]:
        """The app, held busy (not evicted) while the caller serves a request with it."""
        assert self.app is not None
        self.busy += 1
        self.touch()
        try:
            yield self.app
        finally:
            self.busy -= 1
            self.touch()


class Pool:
    """Engines by configuration, at most `max_loaded` running (0: no limit)."""

    def __init__(self, max_loaded: int) -> None:
        self.max_loaded = max_loaded
        self.on_status: Callable[[Engine], None] = lambda eng: None  # after each change
        self.engines: dict[ServerConfig, Engine] = {}
        self._models: dict[tuple[str, str], tuple[LoadedModel, int]] = {}  # path -> (model, n)
        self._lock = asyncio.Lock()  # one eviction decision at a time
        fake = os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING")
        self.fake_delay_s = FAKE_TIMING_S if fake else 0.0

    def engine(self, cfg: ServerConfig) -> Engine:
        """The engine of `cfg` (created unloaded on first sight)."""
        if cfg not in self.engines:
            self.engines[cfg] = Engine(cfg)
        return self.engines[cfg]

    def start_load(self, cfg: ServerConfig, pinned: bool = True) -> Engine:
        """Start loading `cfg`'s engine in the background (nothing if it runs already).
        A load requests start (`pinned` False) is dropped if they all leave while queued."""
        eng = self.engine(cfg)
        eng.pinned = eng.pinned or pinned
        if not eng.running:
            eng.pinned = pinned
            eng.failed, eng.error = False, None
            eng.touch()
            self._set_status(eng, "loading")
            eng._task = asyncio.get_running_loop().create_task(self._load(eng))
        return eng

    async def ready(self, cfg: ServerConfig) -> Engine:
        """`cfg`'s engine once loaded, loading it first if needed (RuntimeError if it fails).
        The caller counts itself in `waiting` meanwhile (`router.forward`)."""
        eng = self.start_load(cfg, pinned=False)
        while eng.status == "loading":
            await asyncio.sleep(POLL_S)
        if eng.status != "loaded":
            raise RuntimeError(eng.error or "unloaded while loading")
        return eng

    async def _load(self, eng: Engine) -> None:
        from loraserve.server.app import create_app
        from loraserve.server.startup import check_files

        try:
            if self.fake_delay_s:
                await asyncio.sleep(self.fake_delay_s)
            if not await self._make_room(eng):
                log.info("router: %s: nobody waits for it any more, not loaded", eng.cfg.alias)
                self._set_status(eng, "unloaded")
                return
            await io_thread(_assemble_default, eng.cfg)
            await io_thread(check_files, eng.cfg)
            model = await self._model(eng.cfg)
            eng.holds_model = True
            app = create_app(eng.cfg, model)
            life = app.router.lifespan_context(app)
            await life.__aenter__()
            eng.app, eng._life = app, life
            state = app.state.server
            while state.engine is None and state.load_error is None:
                await asyncio.sleep(POLL_S)
            if state.load_error is not None:
                raise RuntimeError(state.load_error)
            self._set_status(eng, "loaded")
            log.info("router: engine for %s loaded", eng.cfg.alias[0] if eng.cfg.alias else "?")
        except asyncio.CancelledError:  # unloaded while loading
            await self._close(eng)
            raise
        except Exception as e:  # noqa: BLE001 (any load failure is reported, never raised)
            eng.error = " ".join(str(e).split()) or type(e).__name__
            log.error("router: cannot load %s: %s", eng.cfg.model, eng.error)
            eng.failed = True
            await self._close(eng)

    async def _model(self, cfg: ServerConfig) -> LoadedModel:
        """The loaded weights of `cfg.model`, shared by every engine over the same file
        (counted here, on the event loop, so a load cancelled meanwhile counts nothing)."""
        from loraserve.model.loader import load_model

        key = (str(cfg.model), cfg.dtype)
        if key not in self._models:
            dtype = "float32" if cfg.dtype == "float32" else "native"
            model = await io_thread(load_model, Path(str(cfg.model)), dtype)
            if key not in self._models:  # else loaded meanwhile by another engine: that one
                self._models[key] = (model, 0)
        model, n = self._models[key]
        self._models[key] = (model, n + 1)
        return model

    def _release_model(self, cfg: ServerConfig) -> None:
        key = (str(cfg.model), cfg.dtype)
        if key in self._models:
            model, n = self._models[key]
            if n <= 1:
                del self._models[key]
            else:
                self._models[key] = (model, n - 1)

    async def _make_room(self, eng: Engine) -> bool:
        """Take a place for `eng` under `max_loaded`, unloading least-recently-used idle
        engines; waits (in arrival order: the lock is fair) while every placed engine is in
        use. False, with no place taken, when nobody waits for a load requests started."""
        if self.max_loaded <= 0:
            eng.placed = True
            return True
        async with self._lock:
            while True:
                others = [e for e in self.engines.values() if e.placed and e is not eng]
                if len(others) < self.max_loaded:
                    eng.placed = True
                    return True
                if not eng.pinned and eng.waiting == 0:
                    return False
                idle = [
                    e for e in others if e.busy == 0 and e.waiting == 0 and e.status == "loaded"
                ]
                if idle:
                    victim = min(idle, key=lambda e: e.last_used)
                    log.info(
                        "router: --models-max %d: unloading %s", self.max_loaded, victim.cfg.alias
                    )
                    await self.unload(victim, timeout=0.0)
                    continue
                await asyncio.sleep(POLL_S)

    async def unload(self, eng: Engine, timeout: float) -> None:
        """Stop `eng`: requests in flight get up to `timeout` seconds, then are cancelled."""
        task = eng._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        deadline = time.monotonic() + timeout
        while eng.busy and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if eng.app is not None and eng.busy:
            eng.app.state.server.abort_flights("the model is being unloaded")
        await self._close(eng)

    async def _close(self, eng: Engine) -> None:
        life = eng._life
        eng.app, eng._life = None, None
        eng.placed = eng.pinned = False
        if eng.status != "unloaded":
            self._set_status(eng, "unloaded")
        if life is not None:
            await life.__aexit__(None, None, None)
        if eng.holds_model:
            eng.holds_model = False
            self._release_model(eng.cfg)

    def _set_status(self, eng: Engine, status: str) -> None:
        eng.status = status
        self.on_status(eng)

    async def close_all(self) -> None:
        """Stop every engine, loading ones included (the router's shutdown)."""
        for eng in list(self.engines.values()):
            if eng.running or eng.app is not None:
                await self.unload(eng, timeout=0.0)


def _assemble_default(cfg: ServerConfig) -> None:
    """The default model's file is assembled from its package on its first load."""
    from loraserve.model.default import FILE_NAME, cache_dir, default_model_path

    if Path(str(cfg.model)) == (cache_dir() / FILE_NAME).resolve():
        default_model_path()
