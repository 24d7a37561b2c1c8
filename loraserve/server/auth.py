"""API keys (`--api-key`, `--api-key-file`): ASGI middleware guarding every endpoint but the
public ones, with the key from `Authorization: Bearer KEY` or `X-Api-Key: KEY`.

Keys are compared as SHA-256 digests with `hmac.compare_digest`, against every
configured key, so the time taken says nothing about how much of a key matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from loraserve.server import webui
from loraserve.server.errors import authentication_error

# The web UI's page and files are public too; the API calls it makes carry the key.
PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/v1/models", "/models"}) | webui.PUBLIC_PATHS


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def presented_key(headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    """The key a request carries: `Authorization: Bearer KEY` first, else `X-Api-Key`."""
    api_key = None
    for name, value in headers:
        name = name.lower()
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key" and value.strip():
            api_key = value.strip()
    return api_key


class ApiKeyMiddleware:
    """Answers 401 `authentication_error` unless the request carries a configured key;
    `PUBLIC_PATHS` (health, the model list, the web UI) stay open, as in llama-server."""

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app = app
        self._digests = [_digest(k.encode()) for k in keys]

    def valid(self, key: bytes | None) -> bool:
        """Whether `key` is one of the configured keys (constant time in the key)."""
        if key is None:
            return False
        d = _digest(key)
        ok = False
        for known in self._digests:
            ok |= hmac.compare_digest(d, known)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        if not self.valid(presented_key(scope.get("headers", []))):
            await authentication_error().response()(scope, receive, send)
            return
        await self.app(scope, receive, send)
