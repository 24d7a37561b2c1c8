"""Adapter endpoints: `GET/POST /lora-adapters` (the global scales, as llama-server) and,
**ours**, `POST /lora-adapters/load` and `/unload` for run-time adapters. vLLM's and
SGLang's shapes of load and unload are in `server/compat`, on the same engine calls.

Loads read only from the `--lora-dir` directories: the path is resolved (symlinks
included) and must stay inside one of them, and it must be a regular file or a PEFT
folder of regular files (whose own links must stay inside too) of bounded size.
Every adapter action is an engine method: it runs on the engine thread, in arrival order.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.engine.engine import Engine
from loraserve.lora.adapter import Adapter
from loraserve.lora.catalogue import Entry
from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import (
    ApiError,
    JsonResponse,
    invalid_request,
    not_found,
    not_supported,
)
from loraserve.server.flight import wait
from loraserve.server.offload import io_thread
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
    try:
        st = os.stat(real)
    except OSError as e:  # a link loop, a file gone meanwhile: the caller's input, named
        raise invalid_request(f"path: {shown} cannot be read: {e.strerror or e}") from None
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
    loaded = bool(a.weights)
    return {
        "id": a.id,
        "name": a.name,
        "path": str(a.path),
        "scale": scale,
        "loaded": loaded,
        "pinned": a.pinned,
    }


@router.get("/lora-adapters")
async def list_adapters(request: HttpRequest) -> Response:
    """`[{id, path, scale, name, loaded, pinned}]`: every registered adapter and its global
    scale (`loaded`: its weights are in memory, else it is read again on its next use).
    **Ours:** with `?catalogue=true`, also what the `--lora-dir` directories and
    `--lora-modules` offer that no request used yet (`id` null)."""
    engine = get_state(request).require()
    listed = await wait(engine.list_adapters())
    out = [_adapter_json(a, scale) for a, scale in listed]
    if request.query_params.get("catalogue", "").lower() in ("1", "true"):
        out += [
            {"id": None, "name": e.name, "path": str(e.path), "scale": 0.0, "loaded": False}
            for e in await unregistered(engine, [a for a, _ in listed])
        ]
    return JsonResponse(out)


async def unregistered(engine: Engine, registered: list[Adapter]) -> list[Entry]:
    """The catalogue's entries that name no registered adapter (read off the event loop)."""
    return (await offered(engine, registered))[0]


async def offered(
    engine: Engine, registered: list[Adapter]
) -> tuple[list[Entry], dict[tuple[str, str], str]]:
    """`unregistered`, and the base model each `--lora-modules` entry names (its JSON
    form's `base_model_name`: vLLM's `parent`) by (name case folded, real path)."""
    entries = await io_thread(engine.catalogue_entries)
    taken = {a.name.casefold() for a in registered}
    parents = {
        (e.name.casefold(), str(e.path)): e.base_model for e in entries if e.module and e.base_model
    }
    return [e for e in entries if e.name.casefold() not in taken], parents


@router.post("/lora-adapters", openapi_extra=body_doc(LoraScales))
async def set_scales(request: HttpRequest) -> Response:
    """Set the global scales: `[{id, scale}]`, unlisted adapters to 0. **Ours:** an entry may
    name its adapter (`{name, scale}`: a loaded one, or one under `--lora-dir`, read here if
    no adapter has its name yet); an unknown id or name, a file that does not fit the model,
    a non-number scale or a non-array body is a 400 that changes nothing."""
    engine = get_state(request).require()
    items = [(x.ref, x.scale) for x in (await read_body(request, LoraScales)).root]
    await read_named(engine, [ref for ref, s in items if isinstance(ref, str) and s != 0])
    try:
        await wait(engine.set_global_scales(items))
    except ValueError as e:
        raise invalid_request(f"lora: {e}") from None
    return JsonResponse({"success": True})


async def read_named(engine: Engine, names: list[str]) -> None:
    """Read the catalogue's adapters among ``names`` that no registered adapter has yet,
    registering them at scale 0 as a first use would: one that does not fit the model is a
    400 naming its file before the global scales change (else every request without `lora`
    would fail on it). Unknown names are left to `set_global` (its 400)."""
    wanted = {n.casefold() for n in names} - await _registered_names(engine)
    if not wanted:
        return
    for e in await io_thread(engine.catalogue_entries):
        if e.name.casefold() not in wanted:
            continue
        try:
            await wait(engine.load_adapter(e.path, 0.0, e.name))
        except ValueError as err:  # unless a request registered that name meanwhile
            if e.name.casefold() not in await _registered_names(engine):
                raise invalid_request(f"lora: {err}") from None


async def _registered_names(engine: Engine) -> set[str]:
    return {a.name.casefold() for a, _ in await wait(engine.list_adapters())}


@router.post("/lora-adapters/load", openapi_extra=body_doc(LoadAdapterRequest))
async def load_adapter(request: HttpRequest) -> Response:
    """**Ours:** load `{path, [scale], [name], [pinned]}` from a `--lora-dir` directory, at
    global scale 0 unless `scale` is given; names are unique (case ignored); a `pinned`
    adapter is never evicted."""
    state = get_state(request)
    engine = state.require()
    body = await read_body(request, LoadAdapterRequest)
    if not state.cfg.lora_dirs:
        raise not_supported("loading adapters at run time is off: start with --lora-dir DIR")
    if body.name is not None:
        check_name(body.name)
    real = resolve_adapter_path(state.cfg.lora_dirs, body.path)
    try:
        adapter = await wait(engine.load_adapter(real, body.scale, body.name, body.pinned))
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


def check_name(name: str) -> None:
    """A name given to a load: 400 for one with control characters (a NUL, a newline...),
    which no listing or log could show as it is."""
    bad = next((c for c in name if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise invalid_request(f"name: {name!r} contains the control character {bad!r}")


async def load_named(
    request: HttpRequest, name: str, path: str, *, replace: bool = False, pinned: bool = False
) -> Adapter:
    """Load `path` (inside a `--lora-dir` directory, `resolve_adapter_path`) as adapter
    `name` at global scale 0, or with `replace` into the adapter of that name, in place:
    the one path under the load endpoints of other servers' shapes (`server/compat`).
    `ApiError` in our shape: 501 without `--lora-dir`, 403/404/400 for the path, 400 for
    a taken name or a file that does not fit the model, 503 while the adapter is in use."""
    state = get_state(request)
    engine = state.require()
    if not state.cfg.lora_dirs:
        raise not_supported("loading adapters at run time is off: start with --lora-dir DIR")
    check_name(name)
    real = resolve_adapter_path(state.cfg.lora_dirs, path)
    try:
        return await wait(engine.load_adapter(real, 0.0, name, pinned, replace))
    except ValueError as e:
        raise invalid_request(str(e)) from None


async def unload_named(request: HttpRequest, name: str) -> Adapter:
    """Unload the adapter named `name` (case ignored) once no request uses it: 404 if no
    registered adapter has it, 503 while it stays in use."""
    engine = get_state(request).require()
    listed = [a for a, _ in await wait(engine.list_adapters())]
    found = next((a for a in listed if a.name.casefold() == name.casefold()), None)
    if found is None:
        raise not_found(f"no adapter named {name!r} is loaded")
    await wait(engine.unload_adapter(found.id))
    return found
