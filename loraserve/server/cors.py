"""CORS as llama-server does it (`--cors-origins`, `--cors-methods`, `--cors-headers`,
`--cors-credentials`): an ASGI middleware outside authentication and the loading check.

Every response gets `Access-Control-Allow-Origin`: the request's `Origin` echoed when the
origins are `*` (`*` itself when there is none: never an empty value), only a localhost
`Origin` echoed for the special value `localhost`, else the configured list as given.
Every `OPTIONS` request is a preflight answered 200 here, before the API key is checked
(browsers send no `Authorization` on a preflight), with the credentials, methods and
headers allowed.

**Ours** (issue 31 item 4: a web page the operator visits must not drive the server):
- credentials are never allowed from any origin: under `*`,
  `Access-Control-Allow-Credentials` is false whatever `--cors-credentials` says
  (llama-server allows them with every origin echoed); they are allowed only for an
  explicit list or `localhost`;
- a state-changing request (POST, PUT, PATCH, DELETE) that a browser sends cross-site (an
  `Origin` that is not this server's own host) must carry a JSON content type, so that the
  browser had to preflight it; a form, text or bodyless one is a 415 before any handler
  runs. Clients that send no `Origin` (curl, SDKs) are not affected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraserve.server.errors import ApiError

DEFAULT_ORIGINS = "*"
DEFAULT_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_HEADERS = "*"
LOCALHOST_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


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

    @property
    def allows_credentials(self) -> bool:
        """Credentials only for named origins: never from any origin (`*`)."""
        return self.credentials and self.origins != "*"

    def allow_origin(self, origin: str) -> str | None:
        """The `Access-Control-Allow-Origin` value for a request's `Origin` (None: none)."""
        if self.origins == "*":  # as llama-server, but never an empty header
            return origin if self.credentials and origin else "*"
        if self.origins == "localhost":
            return origin if origin and origin_is_localhost(origin) else None
        return self.origins or None

    def headers_for(self, origin: str, preflight: bool) -> list[tuple[bytes, bytes]]:
        """The CORS response headers of one request (named as llama-server writes them:
        clients that read headers into a plain dict look them up with that case)."""
        out: list[tuple[bytes, bytes]] = []
        allowed = self.allow_origin(origin)
        if allowed is not None:
            out.append((b"Access-Control-Allow-Origin", allowed.encode("latin-1", "replace")))
        if preflight:
            credentials = b"true" if self.allows_credentials else b"false"
            out += [
                (b"Access-Control-Allow-Credentials", credentials),
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
        refused = unpreflighted_write(scope, origin)
        if refused is not None:
            response = refused.response()
            for name, value in extra:
                response.headers[name.decode()] = value.decode("latin-1")
            await response(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {n.lower() for n, _ in message.get("headers", [])}
                added = [(n, v) for n, v in extra if n.lower() not in names]
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def _json_body(scope: Scope) -> bool:
    """Whether the request's content type is JSON (application/json, or a +json type): one
    a browser sends cross-site only after a preflight."""
    kind = _header(scope, b"content-type").split(";")[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def cross_site(origin: str, scope: Scope) -> bool:
    """Whether a request's `Origin` is another site than the server it was sent to (its
    `Host`): a page of the server itself (the web UI) is not cross-site; "null" is."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return True
    return not parts.netloc or parts.netloc.lower() != _header(scope, b"host").lower()


def unpreflighted_write(scope: Scope, origin: str | None = None) -> ApiError | None:
    """The 415 for a state-changing request a browser may send cross-site without a
    preflight (an `Origin` of another site, a content type that is not JSON), else None.
    Shared by `CorsMiddleware` and the Ray ingress's guard (which refuses it before the
    coordinator logs anything)."""
    if origin is None:
        origin = _header(scope, b"origin")
    if scope["method"] not in STATE_CHANGING or not origin or _json_body(scope):
        return None
    if not cross_site(origin, scope):
        return None
    kind = _header(scope, b"content-type") or "none"
    return ApiError(
        415,
        "invalid_request_error",
        f"a cross-site {scope['method']} must have Content-Type application/json "
        f"(got {kind[:100]}): a web page cannot change this server's state without a preflight",
    )
