"""The router's own routes (`router.app` describes them): `GET /health` and `/props` (the
router's, or with `?model=` that model's engine's), `GET /models` and `/v1/models`, `GET
/models/sse`, `POST /models/load` and `POST /models/unload`, with llama-server's answers and
status codes (tools/server/server-models.cpp). Plain Starlette routes: each returns its JSON
answer, or raises `ApiError`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from loraserve.server.errors import ApiError, JsonResponse
from loraserve.server.router.forward import Forward, _bad, _forwarded, _model_field

if TYPE_CHECKING:
    from loraserve.server.router.app import Router

SUCCESS = {"success": True}


def routes(router: Router, forward: Forward) -> list[Route]:
    """The routes, over `router` (`forward`: how a `?model=` GET reaches its engine)."""

    async def health(request: Request) -> Response:
        name = request.query_params.get("model")
        if not name:
            return JsonResponse({"status": "ok"})
        preset = router.find(name)  # public route: it reports, it never loads
        if preset is None:
            raise _bad(f"model '{name}' not found")
        eng = router.engine_of(preset)
        if eng is None or eng.status != "loaded":
            loading = eng.status == "loading" if eng else preset.name in router.pending.tasks
            raise ApiError(
                503, "unavailable_error", "Loading model" if loading else "model is not loaded"
            )
        return await _forwarded(forward, request)

    async def props(request: Request) -> Response:
        if request.query_params.get("model"):
            return await _forwarded(forward, request)
        return JsonResponse(router.props())

    async def models(request: Request) -> Response:
        if request.query_params.get("reload"):
            await router.reload()
        t = int(time.time())
        data = [await router.model_entry(p, t) for p in router.catalog.values() if p.listed]
        data += router.downloads.entries(t)
        return JsonResponse({"data": data, "object": "list"})

    async def models_sse(request: Request) -> Response:
        return StreamingResponse(router.events.stream(), media_type="text/event-stream")

    async def models_load(request: Request) -> Response:
        preset = router.find(_model_field(await request.body()))
        if preset is None:
            raise ApiError(404, "not_found_error", "model is not found")
        if router.running(preset):
            eng = router.engine_of(preset)
            if eng is not None:  # queued for requests: kept now, even if they all leave
                eng.pinned = True
            raise _bad("model is already running")
        if preset.key is None and preset.hf is not None:  # downloaded first (router.pending)
            await router.pending.start(preset, load=True)
            return JsonResponse(SUCCESS)
        if preset.key is None:
            raise ApiError(500, "server_error", f"model name={preset.name} failed to load")
        router.pool.start_load(preset.key)
        return JsonResponse(SUCCESS)

    async def models_unload(request: Request) -> Response:
        name = _model_field(await request.body())
        if name in router.downloads.tasks:  # llama-server: unloading a download cancels it
            await router.downloads.cancel(name)
            return JsonResponse(SUCCESS)
        preset = router.find(name)
        if preset is None:
            raise _bad("model is not found")
        if preset.name in router.pending.tasks:  # its download, as a download's unload
            await router.pending.cancel(preset.name)
            return JsonResponse(SUCCESS)
        eng = router.engine_of(preset)
        if eng is None or not eng.running:
            raise _bad("model is not running")
        await router.pool.unload(eng, timeout=preset.stop_timeout)
        return JsonResponse(SUCCESS)

    return [
        Route("/health", health, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
        Route("/props", props, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models/sse", models_sse, methods=["GET"]),
        Route("/models/load", models_load, methods=["POST"]),
        Route("/models/unload", models_unload, methods=["POST"]),
    ]
