"""The router's `POST /models` (download a model into the cache) and `DELETE /models?model=`
(delete a cached model's files), as llama-server's router (tools/server/server-models.cpp
`post_router_models`, `del_router_models`, `server_models::remove`), with `router.download`
doing the hub's part in a worker thread.

A download is listed in `GET /models` while it runs (`status.value` `downloading`, `source`
`cache`, `can_remove` true) and takes none of the `--models-max` places. Its events on
`/models/sse`: `model_status` (`downloading`) at its start, `download_progress` (`data`:
`{"progress": {URL: {"done", "total"}}}`, at most every 0.1 s a file), then
`download_finished` once the model is listed by its id, or `download_failed`. A removal
unloads the model's engine (in-flight requests get the preset's `stop-timeout`), cancels its
download if one runs, deletes its files and sends `model_remove`.

Errors, all `{"error": {...}}` (llama-server answers some of these with a 500; **ours** never):
400 for an empty or malformed `model` (not `ORG/NAME[:TAG]`), a model that already exists or
is being downloaded, and a model that is not of the download cache (`DELETE`); **ours:** the
hub is asked before the answer, so a repository or tag it does not have is a 404 and a hub
that cannot be reached a 503 (llama-server answers 200, then `download_failed`); 404 for
`DELETE` of a model the router does not know (llama-server: 500).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loraserve.server.errors import ApiError, JsonResponse
from loraserve.server.router.forward import _bad, _model_field
from loraserve.server.router.pending import off_loop

if TYPE_CHECKING:
    from loraserve.server.router import download
    from loraserve.server.router.app import Router

log = logging.getLogger("loraserve.router")


class Downloads:
    """The downloads running now, by model id (event loop only, but for `cancel` flags read
    by the worker threads)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.cancels: dict[str, threading.Event] = {}
        self.progress: dict[str, dict[str, dict[str, int]]] = {}  # id -> url -> done, total

    async def start(self, name: str) -> None:
        """Check `name` with the hub and start its download (ApiError when it cannot be)."""
        from loraserve.server.router import download  # urllib: off the router's start path

        try:
            download.split_repo_tag(name)
        except ValueError as e:
            raise _bad(str(e)) from None
        if name in self.tasks or self.router.find(name) is not None:
            raise _bad(f"model '{name}' already exists")
        token = os.environ.get("HF_TOKEN", "")  # llama-server's --hf-token default
        try:
            plan = await off_loop(download.plan, name, "", token)
        except download.HubError as e:
            kind = "not_found_error" if e.status == 404 else "unavailable_error"
            raise ApiError(e.status, kind, f"cannot download model '{name}': {e}") from None
        if plan.preset:
            raise _bad(f"'{name}' is a repository of presets: start the router with -hf {name}")
        if name in self.tasks or self.router.find(name) is not None:  # raced while asking
            raise _bad(f"model '{name}' already exists")
        self.cancels[name] = threading.Event()
        self.progress[name] = {}
        self.tasks[name] = asyncio.get_running_loop().create_task(self._run(name, plan))

    async def _run(self, name: str, plan: download.Plan) -> None:
        from loraserve.server.router import download

        loop, events = asyncio.get_running_loop(), self.router.events
        events.publish(name, "model_status", {"status": "downloading"})

        def progress(url: str, done: int, total: int) -> None:  # worker thread
            loop.call_soon_threadsafe(self._progress, name, url, done, total)

        ok = False
        try:
            path = await off_loop(download.fetch, plan, progress, self.cancels[name].is_set)
            log.info("router: downloaded %s to %s", name, path)
            ok = True
        except download.Cancelled:
            log.info("router: download of %s cancelled", name)
        except Exception as e:  # noqa: BLE001 (reported as download_failed, never raised)
            log.error("router: download of %s failed: %s", name, e)
        finally:
            self.tasks.pop(name, None)
            self.cancels.pop(name, None)
            self.progress.pop(name, None)
        if ok:
            await self.router.reload()  # listed by its id before `download_finished`
        events.publish(name, "download_finished" if ok else "download_failed")

    def _progress(self, name: str, url: str, done: int, total: int) -> None:
        if name in self.progress:
            self.progress[name][url] = {"done": done, "total": total}
            data = {"progress": {u: dict(p) for u, p in self.progress[name].items()}}
            self.router.events.publish(name, "download_progress", data)

    async def cancel(self, name: str) -> None:
        """Stop `name`'s download and wait for its worker to leave (its partial file gone)."""
        task = self.tasks.get(name)
        if task is not None:
            self.cancels[name].set()
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def entries(self, created: int) -> list[dict[str, Any]]:
        """`GET /models` items of the downloads running now."""
        return [
            {
                "id": name,
                "aliases": [],
                "tags": [],
                "object": "model",
                "owned_by": "llamacpp",
                "created": created,
                "status": {"value": "downloading", "args": ["loraserve", "-hf", name]},
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "source": "cache",
                "can_remove": True,
                "progress": {u: dict(p) for u, p in self.progress.get(name, {}).items()},
            }
            for name in self.tasks
        ]

    async def remove(self, name: str) -> None:
        """`DELETE /models?model=name` (see the module docstring)."""
        from loraserve.server.router import download

        router = self.router
        preset = router.find(name)
        if name not in self.tasks and preset is None:
            raise ApiError(404, "not_found_error", f"model '{name}' not found")
        if preset is not None and not preset.removable:
            raise _bad(f"model '{name}' is not removable (not from the download cache)")
        await self.cancel(name)
        if preset is not None:
            name = preset.name
            eng = router.engine_of(preset)
            if eng is not None and eng.running:
                await router.pool.unload(eng, timeout=preset.stop_timeout)
        removed = await asyncio.to_thread(download.remove, name)
        log.info("router: removed %s from the cache (%s)", name, "done" if removed else "no files")
        await router.reload()
        router.events.publish(name, "model_remove")


def routes(downloads: Downloads) -> list[Route]:
    """`POST /models` and `DELETE /models`, the router's routes over `downloads`."""

    async def models_download(request: Request) -> Response:
        name = _model_field(await request.body())
        if not name:
            raise _bad("model must be a non-empty string")
        await downloads.start(name)
        return JsonResponse({"success": True})

    async def models_delete(request: Request) -> Response:
        name = request.query_params.get("model") or ""
        if not name:
            raise _bad("model must be a non-empty string")
        await downloads.remove(name)
        return JsonResponse({"success": True})

    return [
        Route("/models", models_download, methods=["POST"]),
        Route("/models", models_delete, methods=["DELETE"]),
    ]
