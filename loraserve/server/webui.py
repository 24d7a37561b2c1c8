"""The web UI: `GET /` serves the single-page app of `server/webui/`, `GET /webui/NAME` its
static files (plain HTML, CSS and ES modules; no build step, no external requests).

`--no-webui` turns both off: `/` answers 404 as in llama-server. The page and its files
are public under `--api-key` (as llama-server's UI is); the API calls it makes are not,
and the page asks for the key on the first 401.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from loraserve.server.errors import not_found

WEBUI_DIR = Path(__file__).with_name("webui")
PREFIX = "/webui/"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    # Everything the page needs comes from this server: no external scripts, styles,
    # images or connections, and no inline scripts.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
}


def static_files() -> dict[str, Path]:
    """The files the UI serves, by name (flat folder; only the known content types)."""
    return {p.name: p for p in WEBUI_DIR.iterdir() if p.suffix in CONTENT_TYPES}


PAGE_PATHS = ("/", "/index.html")
ASSET_PATHS = tuple(PREFIX + name for name in sorted(static_files()))
PUBLIC_PATHS = frozenset(PAGE_PATHS + ASSET_PATHS)  # open under --api-key (see auth.py)


def _file(request: HttpRequest, name: str) -> Response:
    # the app's ServerState or the router: both carry the config (no import of state.py,
    # whose engine imports torch: the router process never does)
    if not request.app.state.server.cfg.webui:
        raise not_found()
    path = WEBUI_DIR / name
    return FileResponse(path, media_type=CONTENT_TYPES[path.suffix], headers=HEADERS)


async def index(request: HttpRequest) -> Response:
    """The page (404 under `--no-webui`)."""
    return _file(request, "index.html")


async def asset(request: HttpRequest) -> Response:
    """One of the page's static files, with its content type (404 under `--no-webui`)."""
    return _file(request, request.url.path.removeprefix(PREFIX))


# one route per shipped file: nothing else is reachable
routes = [Route(p, index if p in PAGE_PATHS else asset, methods=["GET"]) for p in PUBLIC_PATHS]


def __getattr__(name: str) -> Any:
    """`router`: the routes as a FastAPI router, made on first use (the router process's app
    is Starlette's and takes `routes`: FastAPI's import is ~0.35 s of its start)."""
    if name != "router":
        raise AttributeError(name)
    from fastapi import APIRouter

    router = APIRouter()
    for path in PAGE_PATHS:
        router.add_api_route(path, index, methods=["GET"], include_in_schema=False)
    for path in ASSET_PATHS:
        router.add_api_route(path, asset, methods=["GET"], include_in_schema=False)
    globals()["router"] = router
    return router
