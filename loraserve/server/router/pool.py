"""The router's engines: one whole loraserve app (`create_app`: its own engine, KV pool,
adapters and chat template) per engine configuration, loaded on demand and unloaded
least-recently-used past `--models-max`.

Engines run in child processes, one per base file (`router.host`, `router.hosts`): a native
crash in one (a segfault, an abort) ends that process and its engines (`unloaded`, `failed`,
loaded again on the next request), never the router (issue 30 item 2). Presets over one base
still share one engine (one copy of the weights, one KV pool) in that base's process, and
engines over the same file with different settings (context, template) still share its
weights there. A spare process, started ahead and holding its imports, takes the next base
to load, so a first load costs the model's load, not an interpreter's start.

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
import itertools
import logging
import os
import time
from collections.abc import Callable

from loraserve.server.config.args import ServerConfig
from loraserve.server.router.engine import Engine, base_of
from loraserve.server.router.hosts import Host, ProxyApp, describe_exit

log = logging.getLogger("loraserve.router")
POLL_S = 0.02
FAKE_TIMING_S = 2.0  # llama-server's (server-models.cpp, `debug_fake_timing`)
_ids = itertools.count(1)


class Pool:
    """Engines by configuration, at most `max_loaded` running (0: no limit), in host
    processes by base file."""

    def __init__(self, max_loaded: int) -> None:
        self.max_loaded = max_loaded
        self.on_status: Callable[[Engine], None] = lambda eng: None  # after each change
        self.bases: Callable[[], set[tuple[str, str]]] = set  # the catalogue's base files
        self.engines: dict[ServerConfig, Engine] = {}
        self.hosts: dict[tuple[str, str], asyncio.Task[Host]] = {}  # by base file
        self.spare: asyncio.Task[Host] | None = None
        self.closing = False  # the router is ending: hosts are stopped, not asked
        self._lock = asyncio.Lock()  # one eviction decision at a time
        fake = os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING")
        self.fake_delay_s = FAKE_TIMING_S if fake else 0.0

    def engine(self, cfg: ServerConfig) -> Engine:
        """The engine of `cfg` (created unloaded on first sight)."""
        if cfg not in self.engines:
            self.engines[cfg] = Engine(cfg)
        return self.engines[cfg]

    def start_spare(self) -> asyncio.Task[Host] | None:
        """Start a spare host if a base of the catalogue has none and none is spare."""
        hosted = {k for k, t in self.hosts.items() if not t.done() or _alive(t)}
        if self.spare is None and self.bases() - hosted:
            self.spare = asyncio.get_running_loop().create_task(Host.start())
        return self.spare

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
        try:
            if self.fake_delay_s:
                await asyncio.sleep(self.fake_delay_s)
            if not await self._make_room(eng):
                log.info("router: %s: nobody waits for it any more, not loaded", eng.cfg.alias)
                self._set_status(eng, "unloaded")
                return
            host = await self._host(base_of(eng.cfg))
            eng.host, eng.eid = host, str(next(_ids))
            eng.meta = await host.load(eng.eid, eng.cfg)
            if not host.alive:
                why = describe_exit(host.proc.returncode)
                raise RuntimeError(f"the engine process died ({why})")
            eng.app = ProxyApp(host, eng.eid)
            self._set_status(eng, "loaded")
            log.info(
                "router: engine for %s loaded (process %d)",
                eng.cfg.alias[0] if eng.cfg.alias else "?",
                host.pid,
            )
        except asyncio.CancelledError:  # unloaded while loading
            await self._close(eng)
            raise
        except Exception as e:  # noqa: BLE001 (any load failure is reported, never raised)
            eng.error = " ".join(str(e).split()) or type(e).__name__
            log.error("router: cannot load %s: %s", eng.cfg.model, eng.error)
            eng.failed = True
            await self._close(eng)

    async def _host(self, key: tuple[str, str]) -> Host:
        """The live host of base file `key`: the spare (a new one started for the next base),
        or a new process."""
        task = self.hosts.get(key)
        if task is None or (task.done() and not _alive(task)):
            spare, self.spare = self.spare, None
            if spare is not None and spare.done() and not _alive(spare):
                spare = None
            task = spare or asyncio.get_running_loop().create_task(Host.start())
            self.hosts[key] = task
            host = await asyncio.shield(task)
            host.key = key
            host.on_exit = self._host_ended
            self.start_spare()
            return host
        return await asyncio.shield(task)

    def _host_ended(self, host: Host, code: int) -> None:
        """A host process ended: its engines are unloaded; a death marks them failed."""
        if host.key is not None:
            task = self.hosts.get(host.key)
            if task is not None and task.done() and not task.cancelled() and task.result() is host:
                del self.hosts[host.key]
        for eng in self.engines.values():
            if eng.host is host:
                if not host.stopping:
                    eng.failed = True
                    eng.error = f"the engine process died ({describe_exit(code)})"
                eng.app, eng.host = None, None
                eng.placed = eng.pinned = False
                if eng.status == "loaded":
                    self._set_status(eng, "unloaded")
        if not host.stopping and not self.closing:
            self.start_spare()  # a process ready for the next load of what died

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
                    await self.unload(victim, timeout=0.0, keep_host=base_of(eng.cfg))
                    continue
                await asyncio.sleep(POLL_S)

    async def unload(
        self, eng: Engine, timeout: float, keep_host: tuple[str, str] | None = None
    ) -> None:
        """Stop `eng`: requests in flight get up to `timeout` seconds, then are cancelled.
        Its host process ends with its last engine, unless it serves base `keep_host`."""
        task = eng._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        deadline = time.monotonic() + timeout
        while eng.busy and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if eng.host is not None and eng.busy:
            await eng.host.abort(eng.eid, "the model is being unloaded")
        await self._close(eng, keep_host)

    async def _close(self, eng: Engine, keep_host: tuple[str, str] | None = None) -> None:
        host = eng.host
        eng.app, eng.host, eng.meta = None, None, None
        eng.placed = eng.pinned = False
        if eng.status != "unloaded":
            self._set_status(eng, "unloaded")
        if host is None or self.closing:
            return
        await host.unload(eng.eid)
        loading = any(
            e.status == "loading" and base_of(e.cfg) == host.key for e in self.engines.values()
        )
        if not host.engines and host.key != keep_host and not loading:
            if host.key is not None and self.hosts.get(host.key) is not None:
                del self.hosts[host.key]
            await host.stop()

    def _set_status(self, eng: Engine, status: str) -> None:
        eng.status = status
        self.on_status(eng)

    async def close_all(self) -> None:
        """Stop every engine, loading ones included, and every host (the router's end): the
        hosts end together, each within `hosts.STOP_TIMEOUT_S` (then SIGKILL), whatever
        state they are in, so the router's shutdown never waits on a stuck engine."""
        self.closing = True
        for eng in list(self.engines.values()):
            task = eng._task
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        tasks = [*self.hosts.values(), *([self.spare] if self.spare is not None else [])]
        self.hosts, self.spare = {}, None
        hosts = []
        for t in tasks:
            if not t.done():
                t.cancel()
            with contextlib.suppress(BaseException):  # a start cancelled, or failed
                hosts.append(await t)
        hosts += [e.host for e in self.engines.values() if e.host is not None]
        await asyncio.gather(*(h.stop() for h in set(hosts)), return_exceptions=True)
        for eng in self.engines.values():
            eng.app, eng.host = None, None
            eng.placed = eng.pinned = False
            if eng.status != "unloaded":
                self._set_status(eng, "unloaded")


def _alive(task: asyncio.Task[Host]) -> bool:
    """Whether a finished host task gave a host that still runs."""
    return not task.cancelled() and task.exception() is None and task.result().alive
