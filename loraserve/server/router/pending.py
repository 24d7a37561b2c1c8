"""Presets whose model is on the hub but not in the download cache yet (`hf-repo =
ORG/NAME[:TAG]` in a preset, `presets.Preset.hf`): downloaded when the preset is first loaded,
as llama-server's child downloads its `-hf` model when it starts. Listing never downloads.

A load (`POST /models/load`, a request naming the preset, `load-on-startup`) asks the hub
first (llama.cpp's requests, `router.download`): a repository or tag it does not have is a 404,
a hub that cannot be reached a 503, each naming the hub's answer, before anything is fetched.
Then the files come in a worker thread while the preset reads `loading` in `GET /models`, with
`download_progress` events on `/models/sse` (**ours**: llama-server's router sees nothing of
its child's download), then `download_finished`, the catalogue is read again (the preset now
names a cached file and gets its engine, shared as any preset's) and the engine loads. A
failure leaves the preset `unloaded` with `failed`, `exit_code` 1 and the error in `GET
/models` (`status_change` with `exit_code` 1 after `download_failed`); the next load tries
again. Requests for the preset share one download. `POST /models/unload` cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from loraserve.server.errors import ApiError

if TYPE_CHECKING:
    from loraserve.server.router import download
    from loraserve.server.router.app import Router
    from loraserve.server.router.presets import Preset

log = logging.getLogger("loraserve.router")


T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a daemon thread of its own: a hub request (up to `download.TIMEOUT_S`
    per read) that the router stops waiting for never holds its exit, as a thread of the
    loop's default executor would (`asyncio.run` joins them)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not done.done():
            if error is None:
                done.set_result(value)
            else:
                done.set_exception(error)

    def run() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as e:  # noqa: BLE001 (handed to the awaiting coroutine)
            value, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name="loraserve-hub", daemon=True).start()
    return await done


class Pending:
    """The preset downloads running now and the last failure of each (event loop only, but
    for the `cancels` flags the worker threads read)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.planned: dict[str, asyncio.Future[None]] = {}  # done once the hub has answered
        self.cancels: dict[str, threading.Event] = {}
        self.progress: dict[str, dict[str, dict[str, int]]] = {}  # name -> url -> done, total
        self.failed: dict[str, tuple[int, str, str]] = {}  # name -> status, type, message
        self.load_after: set[str] = set()  # loads asked for, not only requests

    async def start(self, preset: Preset, load: bool) -> asyncio.Task[None]:
        """Start (or join) `preset`'s download once the hub says what to fetch; ApiError
        when it cannot (also kept for `GET /models`). `load`: its engine loads once the file
        is in, with no request waiting (`/models/load`, `load-on-startup`)."""
        name = preset.name
        if load:
            self.load_after.add(name)
        if name not in self.tasks:
            self.failed.pop(name, None)
            self.planned[name] = asyncio.get_running_loop().create_future()
            self.cancels[name] = threading.Event()
            self.progress[name] = {}
            self.tasks[name] = asyncio.get_running_loop().create_task(self._run(preset))
        task = self.tasks[name]
        await asyncio.shield(self.planned[name])
        return task

    def start_soon(self, preset: Preset) -> None:
        """`start` with `load`, in the background (`load-on-startup`): a failure is only the
        preset's status."""

        async def go() -> None:
            with contextlib.suppress(ApiError):
                await self.start(preset, load=True)

        asyncio.get_running_loop().create_task(go())

    async def ready(self, preset: Preset) -> Preset:
        """`preset` as the catalogue reads it once its file is in (its engine configured,
        not loaded): a request's wait. ApiError when the download fails."""
        await asyncio.shield(await self.start(preset, load=False))
        if preset.name in self.failed:
            raise self.error(preset.name)
        now = self.router.find(preset.name)
        if now is None or now.key is None:
            why = now.error if now is not None and now.error else "not in the catalogue"
            raise ApiError(500, "server_error", f"model name={preset.name} failed to load: {why}")
        return now

    def error(self, name: str) -> ApiError:
        """The last download failure of `name` as an answer."""
        status, kind, message = self.failed[name]
        return ApiError(status, kind, message)

    async def cancel(self, name: str) -> None:
        """Stop `name`'s download and wait for its worker to leave (its partial file gone);
        while the hub is still being asked (nothing on disk yet) the wait is not for its
        answer (up to `download.TIMEOUT_S`)."""
        task = self.tasks.get(name)
        if task is not None:
            self.cancels[name].set()
            if not self.planned[name].done():
                task.cancel()
            await asyncio.wait({task})

    def status(self, name: str) -> dict[str, Any]:
        """What `GET /models` adds to `name`'s `status` (nothing when no download ran)."""
        if name in self.tasks:
            return {"value": "loading"}
        if name in self.failed:
            return {"failed": True, "exit_code": 1, "error": self.failed[name][2]}
        return {}

    async def _run(self, preset: Preset) -> None:
        name, events = preset.name, self.router.events
        assert preset.hf is not None
        repo, file = preset.hf
        events.publish(name, "status_change", {"status": "loading"})
        planned = self.planned[name]
        try:
            plan = await self._plan(name, repo, file)
            planned.set_result(None)
            loop = asyncio.get_running_loop()

            def progress(url: str, done: int, total: int) -> None:  # worker thread
                loop.call_soon_threadsafe(self._progress, name, url, done, total)

            path = await self._fetch(name, plan, progress)
            log.info("router: %s: downloaded %s to %s", name, repo, path)
        except Exception as e:  # noqa: BLE001 (every failure is the preset's status, kept)
            err = e if isinstance(e, ApiError) else ApiError(500, "server_error", f"{name}: {e}")
            log.error("router: %s: %s", name, err.message)
            self.failed[name] = (err.status, err.type, err.message)
            if not planned.done():
                planned.set_exception(err)
            events.publish(name, "download_failed")
            events.publish(name, "status_change", {"status": "unloaded", "exit_code": 1})
            return
        finally:
            if not planned.done():  # cancelled while asking the hub: its waiters are told
                message = f"the download of model '{name}' was cancelled"
                planned.set_exception(ApiError(503, "unavailable_error", message))
                planned.exception()  # (retrieved: no log line when nobody waits)
                events.publish(name, "status_change", {"status": "unloaded", "exit_code": 0})
            for table in (self.tasks, self.planned, self.cancels, self.progress):
                table.pop(name, None)
            load = name in self.load_after
            self.load_after.discard(name)
        events.publish(name, "download_finished")
        await self.router.reload()  # the preset now names the cached file
        now = self.router.find(name)
        if load and now is not None and now.key is not None:
            self.router.pool.start_load(now.key)

    async def _plan(self, name: str, repo: str, file: str) -> download.Plan:
        from loraserve.server.router import download  # urllib: off the router's start path

        token = os.environ.get("HF_TOKEN", "")  # llama-server's --hf-token default
        what = f"cannot download model '{name}' ({' '.join(filter(None, (repo, file)))})"
        try:
            plan = await off_loop(download.plan, repo, file, token)
        except download.HubError as e:
            kind = "not_found_error" if e.status == 404 else "unavailable_error"
            raise ApiError(e.status, kind, f"{what}: {e}") from None
        except ValueError as e:
            raise ApiError(400, "invalid_request_error", f"{what}: {e}") from None
        if plan.preset:
            message = f"{what}: it is a repository of presets, not a model"
            raise ApiError(400, "invalid_request_error", message)
        return plan

    async def _fetch(self, name: str, plan: download.Plan, progress: download.Progress) -> str:
        from loraserve.server.router import download

        what = f"cannot download model '{name}' ({plan.repo})"
        try:
            path = await off_loop(download.fetch, plan, progress, self.cancels[name].is_set)
        except download.HubError as e:
            raise ApiError(503, "unavailable_error", f"{what}: {e}") from None
        except download.Cancelled:
            raise ApiError(503, "unavailable_error", f"{what}: cancelled") from None
        except OSError as e:  # the cache cannot be written
            raise ApiError(503, "unavailable_error", f"{what}: {e}") from None
        return str(path)

    def _progress(self, name: str, url: str, done: int, total: int) -> None:
        if name in self.progress:
            self.progress[name][url] = {"done": done, "total": total}
            data = {"progress": {u: dict(p) for u, p in self.progress[name].items()}}
            self.router.events.publish(name, "download_progress", data)
