"""CORS as llama-server does it (`--cors-origins`, `--cors-methods`, `--cors-headers`,
`--cors-credentials`): an ASGI middleware outside authentication and the loading check.

Every response gets `Access-Control-Allow-Origin`: the request's `Origin` echoed when the
origins are `*` with credentials (llama-server's default), only a localhost `Origin` echoed
for the special value `localhost`, else the configured list as given. Every `OPTIONS`
request is a preflight answered 200 here, before the API key is checked (browsers send no
`Authorization` on a preflight), with the credentials, methods and headers allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_ORIGINS = "*"
DEFAULT_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_HEADERS = "*"
LOCALHOST_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def origin_is_localhost(origin: str) -> bool:
    """Whether an `Origin` value names localhost, 127.0.0.1 or [::1] (any scheme, port)."""
    try:
        return urlsplit(origin).hostname in LOCALHOST_HOSTS
    except ValueError:
        return False


@dataclass(frozen=True)
class CorsPolicy:
    """What the CORS headers say (from the command line)."""

    origins: str = DEFAULT_ORIGINS
    methods: str = DEFAULT_METHODS
    headers: str = DEFAULT_HEADERS
    credentials: bool = True

    def allow_origin(self, origin: str) -> str | None:
        """The `Access-Control-Allow-Origin` value for a request's `Origin` (None: none)."""
        if self.credentials and self.origins == "*":
            return origin
        if self.origins == "localhost":
            return origin if origin and origin_is_localhost(origin) else None
        return self.origins

    def headers_for(self, origin: str, preflight: bool) -> list[tuple[bytes, bytes]]:
        """The CORS response headers of one request (named as llama-server writes them:
        clients that read headers into a plain dict look them up with that case)."""
        out: list[tuple[bytes, bytes]] = []
        allowed = self.allow_origin(origin)
        if allowed is not None:
            out.append((b"Access-Control-Allow-Origin", allowed.encode("latin-1", "replace")))
        if preflight:
            out += [
                (b"Access-Control-Allow-Credentials", b"true" if self.credentials else b"false"),
                (b"Access-Control-Allow-Methods", self.methods.encode("latin-1", "replace")),
                (b"Access-Control-Allow-Headers", self.headers.encode("latin-1", "replace")),
            ]
        return out


def cors_policy(cfg: Any) -> CorsPolicy:
    """The policy of a `ServerConfig` (its `cors_*` fields)."""
    return CorsPolicy(cfg.cors_origins, cfg.cors_methods, cfg.cors_headers, cfg.cors_credentials)


class CorsMiddleware:
    """Adds the policy's headers to every HTTP response and answers every preflight."""

    def __init__(self, app: ASGIApp, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = ""
        for name, value in scope.get("headers", []):
            if name.lower() == b"origin":
                origin = value.decode("latin-1")
        if scope["method"] == "OPTIONS":
            headers = [
                *self.policy.headers_for(origin, preflight=True),
                (b"content-type", b"text/html"),
                (b"content-length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        extra = self.policy.headers_for(origin, preflight=False)

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {n.lower() for n, _ in message.get("headers", [])}
                added = [(n, v) for n, v in extra if n.lower() not in names]
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, send_with_cors)
