"""`GET /tools`, `POST /tools` and `/cors-proxy`, as an ASGI middleware that both the
single-model app and the router put inside the API key check (so the key guards every tool
route) and that owns the MCP servers' lifetime (warmup at the app's start, before it
serves; shutdown at its end, and at once on the first SIGTERM/SIGINT via `stop_all`, so a
tool call in flight never holds the server's shutdown).

Answers are llama-server's (tools/server/server-tools.cpp, server.cpp): the tool list; a
call's JSON answer, or `{"error": ...}` with status 200 when the tool failed; an SSE stream
of `{"chunk"}` events then `{"done": true[, "error"]}` for `"stream": true`; 404 for an
unknown tool; 403 `feature_disabled` when no tool (or no proxy) is enabled. loraserve adds
400s where llama-server would answer 500 to a bad request (parameters of the wrong type,
an `x-tool-cwd` outside `--tools-root`), and keeps llama-server's 500 for an
`x-tool-runtime` it cannot use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraserve.server.errors import ApiError, JsonResponse
from loraserve.server.tools.builtin import Call, ParamError, Tool, builtin_tools
from loraserve.server.tools.confine import Confinement, CwdError, ToolError
from loraserve.server.tools.mcp_manager import McpManager
from loraserve.server.tools.proxy import proxy_request
from loraserve.server.tools.runtime import RuntimeSpecError, check_runtime

log = logging.getLogger("loraserve.tools")
_LIVE: weakref.WeakSet[ToolsMiddleware] = weakref.WeakSet()
_REMOVED_PARAMS = ("cwd", "runtime", "resp_type")  # set by headers only, never by the model


def stop_all() -> None:
    """Begin the shutdown of every app's MCP servers now (call on the event loop)."""
    for mw in list(_LIVE):
        mw.mcp.begin_shutdown()


def _disabled() -> ApiError:
    return ApiError(403, "feature_disabled", "this feature is disabled")


class ToolsMiddleware:
    """Serves the tool routes for `cfg` (a `ServerConfig`), passes the rest to `app`."""

    def __init__(self, app: ASGIApp, cfg: Any) -> None:
        self.app = app
        self.cfg = cfg.tools
        self.conf = Confinement(self.cfg.root or ".")
        self.mcp = McpManager(self.cfg.mcp_servers)
        self.tools: dict[str, Tool] = {
            t.name: t for t in builtin_tools() if t.name in self.cfg.tools
        }
        _LIVE.add(self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._on_shutdown(receive), self._after_startup(send))
            return
        path = scope.get("path")
        if scope["type"] != "http" or path not in ("/tools", "/cors-proxy"):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            if path == "/cors-proxy":
                if not self.cfg.ui_mcp_proxy:
                    raise _disabled()
                response = await proxy_request(request)
            else:
                response = await self._tools_route(request)
        except ApiError as e:
            response = e.response()
        await response(scope, receive, send)

    def _after_startup(self, send: Send) -> Send:
        """The MCP warmup runs once the app has started (its model loading meanwhile),
        before the server is told the startup is complete and starts serving."""

        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete" and not self.mcp.empty:
                await self.mcp.warmup()
                self._add_mcp_tools()
            await send(message)

        return wrapped

    def _on_shutdown(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.mcp.shutdown()
            return message

        return wrapped

    def _add_mcp_tools(self) -> None:
        added = 0
        for d in self.mcp.tools:
            name = f"{d.server}_{d.name}"
            if name in self.tools:
                log.warning(
                    "MCP tool %r from server %r collides with an existing tool, skipping",
                    name,
                    d.server,
                )
                continue

            async def run(params: dict[str, Any], call: Call, d: Any = d) -> Any:
                return await self.mcp.call_tool(d.server, d.name, params)

            self.tools[name] = Tool(
                name, name, d.description, {}, run_async=run, uses_cwd=False, kind="mcp",
                schema=d.input_schema,
            )  # fmt: skip
            added += 1
        if added:
            log.info("added %d MCP tools", added)

    async def _tools_route(self, request: Request) -> Response:
        if not self.cfg.enabled:
            raise _disabled()
        if request.method == "GET":
            return JsonResponse([t.to_json() for t in self.tools.values()])
        if request.method != "POST":
            raise ApiError(405, "invalid_request_error", "use GET or POST on /tools")
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            raise ApiError(
                400, "invalid_request_error", f"malformed JSON in the body: {e}"
            ) from None
        if not isinstance(body, dict) or not isinstance(body.get("tool"), str):
            raise ApiError(400, "invalid_request_error", 'the body needs a string "tool"')
        params = body.get("params", {})
        stream = body.get("stream", False)
        if not isinstance(params, dict) or not isinstance(stream, bool):
            raise ApiError(
                400, "invalid_request_error", '"params" must be an object, "stream" a boolean'
            )
        params = {k: v for k, v in params.items() if k not in _REMOVED_PARAMS}
        tool = self.tools.get(body["tool"])
        if tool is None:
            raise ApiError(404, "invalid_request_error", f'unknown tool "{body["tool"]}"')
        if stream and not tool.support_stream:
            raise ApiError(
                404, "invalid_request_error", f'tool "{tool.name}" does not support stream = true'
            )
        runtime = request.headers.get("x-tool-runtime", "")
        if runtime and tool.kind == "server":
            try:
                check_runtime(runtime)
            except RuntimeSpecError as e:
                raise ApiError(500, "server_error", str(e)) from None
        try:
            cwd = self.conf.workdir(request.headers.get("x-tool-cwd"))
        except CwdError as e:
            raise ApiError(400, "invalid_request_error", str(e)) from None
        call = Call(self.conf, cwd, request.headers.get("x-resp-type", ""))
        if stream:
            return StreamingResponse(_stream(tool, params, call), media_type="text/event-stream")
        try:
            return JsonResponse(await tool.invoke(params, call))
        except ToolError as e:
            return JsonResponse({"error": str(e)})
        except ParamError as e:
            raise ApiError(400, "invalid_request_error", f"tool {tool.name}: {e}") from None


async def _stream(tool: Tool, params: dict[str, Any], call: Call) -> AsyncIterator[str]:
    """SSE events of a streamed call; leaving (the client gone) cancels the tool."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def emit(chunk: str) -> None:
        if chunk:
            await queue.put({"chunk": chunk})

    async def run() -> None:
        done: dict[str, Any] = {"done": True}
        try:
            await tool.invoke(params, Call(call.conf, call.cwd, call.resp_type, emit))
        except (ToolError, ParamError) as e:
            done["error"] = str(e)
        except Exception as e:  # noqa: BLE001 (the stream reports it, as llama-server does)
            log.exception("tool %s failed", tool.name)
            done["error"] = str(e) or type(e).__name__
        await queue.put(done)

    task = asyncio.create_task(run())
    try:
        while True:
            event = await queue.get()
            yield f"data: {json.dumps(event)}\n\n"
            if event.get("done"):
                break
    finally:
        task.cancel()
