"""vLLM's run-time adapter endpoints: `POST /v1/load_lora_adapter {lora_name, lora_path,
load_inplace}` and `POST /v1/unload_lora_adapter {lora_name}`, answered as vLLM answers
(vllm/entrypoints/openai/models/serving.py): a plain-text `Success: ...` line, or
`{"error": {"message", "type", "param", "code"}}` with vLLM's types (`InvalidUserInput`,
`NotFoundError`, ...). Adapters loaded here are used by naming them in a request's `model`,
as in vLLM (global scale 0), and listed by `GET /v1/models` with `root` and `parent`.

**Ours:** paths are read only under `--lora-dir` (vLLM reads any path once
`VLLM_ALLOW_RUNTIME_LORA_UPDATING` is set); a file that does not fit the model is a 400
`BadRequestError` (vLLM 0.10 and earlier; later ones answer 500).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import PlainTextResponse, Response

from loraserve.server.errors import ApiError, JsonResponse
from loraserve.server.native.lora_api import load_named, unload_named

router = APIRouter()
TYPE_OF_STATUS = {
    400: "BadRequestError",
    403: "PermissionError",
    404: "NotFoundError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


def error(message: str, type: str, code: int) -> Response:
    """vLLM's `ErrorResponse` body."""
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return JsonResponse(body, status_code=code)


async def _body(request: HttpRequest) -> dict[str, Any] | Response:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as e:
        return error(f"Invalid JSON in request body: {e}", "BadRequestError", 400)
    if not isinstance(body, dict):
        return error("request body must be a JSON object", "BadRequestError", 400)
    return body


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: HttpRequest) -> Response:
    """vLLM: load `lora_path` as `lora_name`; `load_inplace` replaces the weights of an
    adapter already loaded under that name (its cache key changes with its content)."""
    body = await _body(request)
    if isinstance(body, Response):
        return body
    name, path = _text(body.get("lora_name")), _text(body.get("lora_path"))
    if not name or not path:
        return error("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400)
    inplace = body.get("load_inplace", False)
    if not isinstance(inplace, bool):
        return error("'load_inplace' must be true or false", "BadRequestError", 400)
    try:
        await load_named(request, name, path, replace=inplace)
    except ApiError as e:
        if e.status == 404:
            message = f"Loading lora {name} failed: No adapter found for {path}"
            return error(message, "NotFoundError", 404)
        if e.status == 400 and "is already loaded" in e.message:
            return error(
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                "InvalidUserInput",
                400,
            )
        return error(e.message, TYPE_OF_STATUS.get(e.status, "InternalServerError"), e.status)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: HttpRequest) -> Response:
    """vLLM: unload `lora_name` once no request uses it (its KV leaves the cache)."""
    body = await _body(request)
    if isinstance(body, Response):
        return body
    name = _text(body.get("lora_name"))
    if not name:
        return error(
            "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput", 400
        )
    try:
        await unload_named(request, name)
    except ApiError as e:
        if e.status == 404:
            return error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        return error(e.message, TYPE_OF_STATUS.get(e.status, "InternalServerError"), e.status)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
