"""Adapter endpoints: `GET/POST /lora-adapters` (the global scales, as llama-server) and,
**ours**, `POST /lora-adapters/load` and `/unload` for run-time adapters.

Loads read only from the `--lora-dir` directories: the path is resolved (symlinks
included) and must stay inside one of them, and it must be a regular file or a PEFT
folder of regular files (whose own links must stay inside too) of bounded size.
Every adapter action is an engine method: it runs on the engine thread, in arrival order.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.lora.adapter import Adapter
from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import (
    ApiError,
    JsonResponse,
    invalid_request,
    not_found,
    not_supported,
)
from loraserve.server.flight import wait
from loraserve.server.schemas import LoadAdapterRequest, LoraScales, UnloadAdapterRequest
from loraserve.server.state import get_state

router = APIRouter()
MAX_ADAPTER_BYTES = 2 << 30
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _regular_size(path: str, root: str, shown: str) -> int:
    real = os.path.realpath(path)
    if not _inside(real, root):
        raise ApiError(403, "permission_error", f"path: {shown} links outside {root}")
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise invalid_request(f"path: {shown} is not a regular file")
    return st.st_size


def resolve_adapter_path(lora_dirs: tuple[str, ...], path: str) -> str:
    """The real path of an adapter file or PEFT folder inside an allowed directory.

    A relative path is looked up in each directory in turn. 403 `permission_error` for a
    path (or a link) leading outside them, 404 when nothing is there, 400 for anything
    that is not a regular file or a PEFT folder, or is larger than `MAX_ADAPTER_BYTES`.
    """
    if "\x00" in path:
        raise invalid_request("path: must not contain NUL characters")
    candidates = [path] if os.path.isabs(path) else [os.path.join(d, path) for d in lora_dirs]
    outside = True
    for cand in candidates:
        real = os.path.realpath(cand)
        root = next((d for d in lora_dirs if _inside(real, d)), None)
        if root is None:
            continue
        outside = False
        if not os.path.lexists(real):
            continue
        if os.path.isdir(real):
            missing = [f for f in PEFT_FILES if not os.path.lexists(os.path.join(real, f))]
            if missing:
                raise invalid_request(f"path: {path} is a folder without {', '.join(missing)}")
            size = sum(
                _regular_size(os.path.join(real, f), root, f"{path}/{f}") for f in PEFT_FILES
            )
        else:
            size = _regular_size(real, root, path)
        if size > MAX_ADAPTER_BYTES:
            raise invalid_request(f"path: {path} is larger than {MAX_ADAPTER_BYTES} bytes")
        return real
    if outside:
        raise ApiError(
            403, "permission_error", f"path: {path} is outside the allowed --lora-dir directories"
        )
    raise not_found(f"path: no adapter file or folder at {path}")


def _adapter_json(a: Adapter, scale: float) -> dict[str, Any]:
    return {"id": a.id, "name": a.name, "path": str(a.path), "scale": scale}


@router.get("/lora-adapters")
async def list_adapters(request: HttpRequest) -> Response:
    """`[{id, path, scale, name}]`: every loaded adapter and its global scale."""
    engine = get_state(request).require()
    listed = await wait(engine.list_adapters())
    return JsonResponse([_adapter_json(a, scale) for a, scale in listed])


@router.post("/lora-adapters", openapi_extra=body_doc(LoraScales))
async def set_scales(request: HttpRequest) -> Response:
    """Set the global scales: `[{id, scale}]`, unlisted adapters to 0. **Ours:** an unknown
    id, a non-number scale or a non-array body is a 400 that changes nothing."""
    engine = get_state(request).require()
    items = [(x.id, x.scale) for x in (await read_body(request, LoraScales)).root]
    try:
        await wait(engine.set_global_scales(items))
    except ValueError as e:
        raise invalid_request(f"lora: {e}") from None
    return JsonResponse({"success": True})


@router.post("/lora-adapters/load", openapi_extra=body_doc(LoadAdapterRequest))
async def load_adapter(request: HttpRequest) -> Response:
    """**Ours:** load `{path, [scale], [name]}` from a `--lora-dir` directory, at global
    scale 0 unless `scale` is given; names are unique (case ignored)."""
    state = get_state(request)
    engine = state.require()
    body = await read_body(request, LoadAdapterRequest)
    if not state.cfg.lora_dirs:
        raise not_supported("loading adapters at run time is off: start with --lora-dir DIR")
    real = resolve_adapter_path(state.cfg.lora_dirs, body.path)
    try:
        adapter = await wait(engine.load_adapter(real, body.scale, body.name))
    except ValueError as e:
        raise invalid_request(str(e)) from None
    return JsonResponse(_adapter_json(adapter, body.scale))


@router.post("/lora-adapters/unload", openapi_extra=body_doc(UnloadAdapterRequest))
async def unload_adapter(request: HttpRequest) -> Response:
    """**Ours:** unload `{id}` once no queued or running request uses it; KV computed with
    it leaves the prefix cache (unless another loaded adapter has the same content)."""
    engine = get_state(request).require()
    adapter_id = (await read_body(request, UnloadAdapterRequest)).id
    try:
        await wait(engine.unload_adapter(adapter_id))
    except ValueError as e:
        raise invalid_request(f"id: {e}") from None
    return JsonResponse({"success": True})
