"""SGLang's run-time adapter endpoints: `POST /load_lora_adapter {lora_name, lora_path,
pinned}` and `POST /unload_lora_adapter {lora_name}`, answered as SGLang answers
(python/sglang/srt/entrypoints/http_server.py, `LoRAUpdateOutput`): `{"success",
"error_message", "loaded_adapters"}` with status 200, or 400 with `success` false and the
reason (**ours:** plus the contract's `error` object, as every error answer here has).
`loaded_adapters` maps each registered adapter's name to its path. A `pinned`
adapter is never evicted (`--lora-max-loaded`, `--lora-max-memory`).

**Ours:** paths are read only under `--lora-dir`, and an adapter is used by naming it in a
request's `model` or a `lora` entry's `name`.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.server.errors import ApiError, JsonResponse, error_body
from loraserve.server.flight import wait
from loraserve.server.native.lora_api import load_named, unload_named
from loraserve.server.state import get_state

router = APIRouter()


def _output(success: bool, message: str | None, loaded: dict[str, str] | None) -> Response:
    body: dict[str, object] = {
        "success": success,
        "error_message": message,
        "loaded_adapters": loaded,
    }
    if not success:  # **ours:** the contract's error object too (SGLang clients ignore it)
        body["error"] = error_body(message or "failed", "invalid_request_error", 400)["error"]
    return JsonResponse(body, status_code=200 if success else 400)


async def _loaded(request: HttpRequest) -> dict[str, str]:
    listed = await wait(get_state(request).require().list_adapters())
    return {a.name: str(a.path) for a, _ in listed}


async def _body(request: HttpRequest) -> dict[str, Any] | Response:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as e:
        return _output(False, f"Invalid JSON in request body: {e}", None)
    if not isinstance(body, dict):
        return _output(False, "request body must be a JSON object", None)
    return body


@router.post("/load_lora_adapter")
async def load_lora_adapter(request: HttpRequest) -> Response:
    """SGLang: load `lora_path` as `lora_name` (`pinned`: never evicted)."""
    body = await _body(request)
    if isinstance(body, Response):
        return body
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        return _output(False, "lora_name and lora_path must be non-empty strings", None)
    pinned = body.get("pinned", False)
    if not isinstance(pinned, bool):
        return _output(False, "pinned must be true or false", None)
    try:
        await load_named(request, name, path, pinned=pinned)
    except ApiError as e:
        if "is already loaded" in e.message:
            message = f"Failed to load LoRA adapter {name} because it is already loaded"
            return _output(False, message, None)
        return _output(False, f"Failed to load LoRA adapter {name}: {e.message}", None)
    return _output(True, None, await _loaded(request))


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(request: HttpRequest) -> Response:
    """SGLang: unload `lora_name` once no request uses it."""
    body = await _body(request)
    if isinstance(body, Response):
        return body
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        return _output(False, "lora_name must be a non-empty string", None)
    try:
        await unload_named(request, name)
    except ApiError as e:
        if e.status == 404:
            return _output(False, f"LoRA adapter {name} is not loaded", None)
        return _output(False, e.message, None)
    return _output(True, None, await _loaded(request))
