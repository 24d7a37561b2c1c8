"""What the Ray ingress checks before it reads a body or forwards anything: a browser's
cross-site write without a preflight (`server/cors.py`), the API key (the replicas'
`--api-key` / `--api-key-file`, same public paths as `server/auth.py`) and the body's size
(`server/app.py`'s limit, declared or streamed). A refused request is answered by the
ingress itself, in llama-server's error shape: it never reaches the coordinator's
log of global writes, nor any replica, and its body is never parsed (the routing key is
read from it only after these checks).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from loraserve.server.app import MAX_BODY_BYTES
from loraserve.server.auth import PUBLIC_PATHS, ApiKeyMiddleware, presented_key
from loraserve.server.cors import unpreflighted_write
from loraserve.server.errors import ApiError, authentication_error


async def _no_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The key check's middleware guards no app here: only its `valid` is used."""


class BodyTooLarge(Exception):
    """A request body over the limit (declared or as sent)."""


class IngressGuard:
    """The ingress's checks: `refuse` before the body, `read_body` within the limit."""

    def __init__(self, api_keys: Sequence[str] = (), max_body: int = MAX_BODY_BYTES) -> None:
        self._keys = ApiKeyMiddleware(_no_app, api_keys) if api_keys else None
        self.max_body = max_body

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> IngressGuard:
        """The guard for replicas started with the `loraserve serve` flags ``argv``."""
        from loraserve.server.config.args import parse_server_args

        return cls(parse_server_args(list(argv)).api_keys)

    def too_big(self) -> ApiError:
        return ApiError(
            413, "invalid_request_error", f"request body is larger than {self.max_body} bytes"
        )

    def refuse(self, request: Request) -> Response | None:
        """The answer to a request refused on its headers (a web page's cross-site write
        without a preflight: 415, as the replicas' CORS layer answers it; no valid key off
        the public paths: 401; a declared length over the limit: 413), else None."""
        unsafe = unpreflighted_write(request.scope)
        if unsafe is not None:  # before the coordinator logs it as a global write
            return unsafe.response()
        if self._keys is not None and request.url.path not in PUBLIC_PATHS:
            if not self._keys.valid(presented_key(request.scope.get("headers", []))):
                return authentication_error().response()
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return self.too_big().response()
        return None

    async def read_body(self, request: Request) -> bytes:
        """The body, read chunk by chunk; `BodyTooLarge` as soon as it passes the limit."""
        chunks, seen = [], 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > self.max_body:
                raise BodyTooLarge
            chunks.append(chunk)
        return b"".join(chunks)
