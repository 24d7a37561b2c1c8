"""Errors in llama-server's shape, the FastAPI handlers that produce them, and JSON output.
FastAPI and pydantic are imported where used: the router's app (Starlette alone) imports this
module too, and their import is ~0.35 s of its start.

Every error answer is `{"error": {"code": <status>, "message": ..., "type": ...}}`, plus
`n_prompt_tokens` and `n_ctx` inside `error` for `exceed_context_size_error`, as llama-server
sends them. **Ours:** malformed JSON is a 400 `invalid_request_error` (llama-server: 500).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraserve.engine.admission import QueueFull
from loraserve.server.clients import bind_client
from loraserve.server.jsonout import JsonResponse
from loraserve.server.jsonout import json_dumps as json_dumps  # re-exported for importers

if TYPE_CHECKING:
    from pydantic import BaseModel

log = logging.getLogger("loraserve.server")

STATUS_OF_TYPE: dict[str, int] = {
    "invalid_request_error": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
}

M = TypeVar("M", bound="BaseModel")


class ApiError(Exception):
    """An error answer: HTTP status, contract `type`, message and extra fields of `error`."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The JSON body: `{"error": {"code", "message", "type", ...extra}}`."""
        return error_body(self.message, self.type, self.status, **self.extra)

    def response(self) -> JSONResponse:
        """The body as a JSON response with this error's status."""
        return JsonResponse(self.body(), status_code=self.status, headers=self.headers or None)


def error_body(
    message: str, type: str = "invalid_request_error", code: int | None = None, **extra: Any
) -> dict[str, Any]:
    """`{"error": {"code", "message", "type", ...}}`; `code` defaults to the type's status."""
    code = STATUS_OF_TYPE.get(type, 500) if code is None else code
    return {"error": {"code": code, "message": message, "type": type, **extra}}


def invalid_request(message: str) -> ApiError:
    """400 `invalid_request_error`: the request is wrong (bad field, unknown id, ...)."""
    return ApiError(400, "invalid_request_error", message)


def authentication_error(message: str = "Invalid API Key") -> ApiError:
    """401 `authentication_error` (llama-server's message by default)."""
    return ApiError(401, "authentication_error", message)


def not_found(message: str = "File Not Found") -> ApiError:
    """404 `not_found_error` (llama-server's message for unknown routes by default)."""
    return ApiError(404, "not_found_error", message)


def server_error(message: str = "Internal server error") -> ApiError:
    """500 `server_error`: our fault."""
    return ApiError(500, "server_error", message)


def not_supported(message: str) -> ApiError:
    """501 `not_supported_error`: valid request for a feature this server lacks."""
    return ApiError(501, "not_supported_error", message)


def unavailable(message: str = "Loading model") -> ApiError:
    """503 `unavailable_error` (llama-server's message while the model loads by default)."""
    return ApiError(503, "unavailable_error", message)


def exceed_context_size(n_prompt_tokens: int, n_ctx: int, message: str | None = None) -> ApiError:
    """400 `exceed_context_size_error` carrying `n_prompt_tokens` and `n_ctx`."""
    if message is None:
        message = (
            f"request ({n_prompt_tokens} tokens) exceeds the available context size "
            f"({n_ctx} tokens), try increasing it"
        )
    return ApiError(
        400, "exceed_context_size_error", message, n_prompt_tokens=n_prompt_tokens, n_ctx=n_ctx
    )


def _loc(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "union[", "list[", "json-or-python")):
            out += f".{part}" if out else str(part)
    return out


def validation_message(errors: Sequence[Any], *, located: bool = False) -> str:
    """One line naming each offending field, e.g. `top_p: Input should be <= 1`, from
    pydantic error dicts; `located`: FastAPI's, whose `loc` starts with body/query/path."""
    lines: list[str] = []
    for err in errors:
        if err.get("type") == "json_invalid":
            detail = err.get("ctx", {}).get("error", "")
            return f"Invalid JSON in request body: {detail}".rstrip(": ")
        loc = err.get("loc", ())
        where = _loc(loc[1:] if located else loc)
        if not where and err.get("type") == "missing":
            return "request body is required (a JSON object)"
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if msg.startswith(("[", ".")) and where:
            line = f"{where}{msg}"
        else:
            line = f"{where}: {msg}" if where else msg
        if line not in lines:
            lines.append(line)
    return "; ".join(lines) or "invalid request"


def parse_body(model: type[M], body: bytes | str | Any) -> M:
    """Validate a request body (raw JSON bytes/str, or already-decoded data) into `model`;
    raises `ApiError` 400 naming the field(s) on malformed JSON or invalid values."""
    from pydantic import ValidationError

    if isinstance(body, bytes | str):
        try:
            body = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError) as exc:
            raise invalid_request(f"Invalid JSON in request body: {exc}") from None
    if body is None:
        raise invalid_request("request body is required (a JSON object)")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise invalid_request(validation_message(exc.errors())) from None


def _http_error_type(status: int) -> str:
    if status in (400, 405, 413, 415, 422):
        return "invalid_request_error"
    for type_, code in STATUS_OF_TYPE.items():
        if code == status:
            return type_
    return "server_error" if status >= 500 else "invalid_request_error"


# "METHOD /path from host:port" of the HTTP request being answered (set by `_CatchAll`;
# read by the log lines of requests that end early, `flight.Flight`)
current_endpoint: ContextVar[str] = ContextVar("current_endpoint", default="-")


class _CatchAll:
    """ASGI middleware: an exception no handler took becomes a logged 500 `server_error`
    answer (or, once a streamed response has started, a logged, closed stream)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        client = scope.get("client")
        where = f"{client[0]}:{client[1]}" if client else "-"
        current_endpoint.set(f"{scope.get('method')} {scope.get('path')} from {where}")
        bind_client(scope)

        async def send_wrapper(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await server_error(f"Internal server error: {type(exc).__name__}").response()(
                    scope, receive, send
                )


def log_refusal(request: Request, status: int, message: str) -> None:
    """One log line for a refused request (4xx): client, endpoint, status and reason (cut
    to 200 characters: a reason may quote the request)."""
    client = f"{request.client.host}:{request.client.port}" if request.client else "-"
    reason = message if len(message) <= 200 else f"{message[:200]}..."
    log.info(
        "refused %s %s from %s: %d %s", request.method, request.url.path, client, status, reason
    )


def install_error_handlers(app: Starlette) -> None:
    """Make every error `app` answers take the contract's shape: `ApiError` → its body;
    invalid or malformed request body → 400 naming the field (a FastAPI app's validation);
    unknown route → 404; wrong method → 405; anything unexpected → logged 500 `server_error`."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        if 400 <= exc.status < 500:
            log_refusal(request, exc.status, exc.message)
        return exc.response()

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        from fastapi.exceptions import RequestValidationError

        located = isinstance(exc, RequestValidationError)
        err = invalid_request(validation_message(exc.errors(), located=located))
        log_refusal(request, err.status, err.message)
        return err.response()

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        type_ = _http_error_type(exc.status_code)
        if exc.status_code == 404:
            message = "File Not Found"
        elif exc.status_code == 405:
            message = f"Method {request.method} not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        resp = JsonResponse(error_body(message, type_, exc.status_code), exc.status_code)
        for key, value in (exc.headers or {}).items():
            resp.headers[key] = value
        return resp

    async def on_queue_full(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, QueueFull)
        log.info("refused %s %s: 503 %s", request.method, request.url.path, exc)
        headers = {"Retry-After": str(exc.retry_after_s)}
        return ApiError(503, "unavailable_error", str(exc), headers).response()

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s: %r", request.method, request.url.path, exc)
        return server_error(f"Internal server error: {type(exc).__name__}").response()

    app.add_exception_handler(ApiError, on_api_error)
    fastapi = sys.modules.get("fastapi")  # imported if `app` is FastAPI's (the router's is not)
    if fastapi is not None and isinstance(app, fastapi.FastAPI):
        from fastapi.exceptions import RequestValidationError
        from pydantic import ValidationError

        app.add_exception_handler(RequestValidationError, on_validation)
        app.add_exception_handler(ValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(QueueFull, on_queue_full)
    app.add_exception_handler(Exception, on_unexpected)
    app.add_middleware(_CatchAll)
