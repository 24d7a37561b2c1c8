"""`/cors-proxy?url=URL` (`--ui-mcp-proxy`): the web UI reaches a remote MCP server through
this server, which answers with its own CORS headers (llama-server's server-cors-proxy.h).

GET and POST are forwarded to an http(s) URL without credentials in it; the request's
`x-llama-server-proxy-header-NAME` headers are sent as `NAME`, its body as the body; the
answer's status, headers (less the hop-by-hop ones) and body come back as they arrive.
A bad target URL is a 400, an unreachable one a 502.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from loraserve.server.errors import ApiError

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0  # llama-server's read and write timeouts
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
        "content-length", "proxy-authenticate", "proxy-authorization"}  # fmt: skip


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


def _target(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as e:
        raise _bad(f"invalid target URL: {e}") from None
    if not host:
        raise _bad("invalid target URL: missing host")
    if parts.password:
        raise _bad("authentication in target URL is not supported")
    if parts.scheme not in ("http", "https"):
        raise _bad(f"unsupported URL scheme in target URL: {parts.scheme}")
    return url


async def proxy_request(request: Request) -> Response:
    """Forward `request` to its `url` query parameter (see the module docstring)."""
    if request.method not in ("GET", "POST"):
        raise ApiError(405, "invalid_request_error", "use GET or POST on /cors-proxy")
    url = _target(request.query_params.get("url", ""))
    headers = {
        k[len(PREFIX) :]: v
        for k, v in request.headers.items()
        if k.lower().startswith(PREFIX) and len(k) > len(PREFIX)
    }
    body = await request.body() if request.method == "POST" else None
    import httpx  # here: ~0.1 s off every server's start, which may never proxy

    client = httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False)
    try:
        upstream = await client.send(
            client.build_request(request.method, url, headers=headers, content=body), stream=True
        )
    except httpx.HTTPError as e:
        await client.aclose()
        raise ApiError(502, "server_error", f"cannot reach {url}: {e}") from None
    kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
    if upstream.status_code in (204, 304):
        await upstream.aclose()
        await client.aclose()
        return Response(status_code=upstream.status_code, headers=kept)

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()
            await client.aclose()

    return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)
