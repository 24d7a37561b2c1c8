"""The router's side of its engine hosts (`router.host`): one child process per base file,
started ahead of need (a spare that has imported torch and our modules waits, so a model's
first load costs its load, not an interpreter's start), talked to over a Unix socket, and
watched: a host that dies (a segfault, an abort, the OOM killer) takes its engines with it
and nothing else; they read `unloaded` with `failed` and the exit, and load again on the
next request (issue 30 item 2).

`ProxyApp` is the ASGI app a hosted engine is to the router: the request's body and headers
go to the host, the answer streams back as it comes; a client that leaves closes the
upstream request (the engine cancels it); a host that dies mid-answer ends the answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import json
import logging
import os
import pickle
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from loraserve.server.router.host import ENGINE_HEADER, PEER_HEADER

if TYPE_CHECKING:
    import httpx  # imported when a host starts: ~0.1 s the router's start does without

log = logging.getLogger("loraserve.router")
START_TIMEOUT_S = 300.0  # a host's interpreter start and imports (a busy machine's)
STOP_TIMEOUT_S = 3.0  # a host asked to end gets this long before SIGKILL
CONTROL_TIMEOUT_S = 30.0  # an unload or abort past this: the host is stuck, and killed
HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"host", b"content-length"}


def describe_exit(code: int | None) -> str:
    """`exit status N` or `killed by SIGSEGV`."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class Host:
    """One host process: its socket, its HTTP client, the engine ids it runs."""

    def __init__(self, proc: asyncio.subprocess.Process, folder: str) -> None:
        self.proc = proc
        self.folder = folder
        self.sock = os.path.join(folder, "host.sock")
        self._client: httpx.AsyncClient | None = None  # once it listens (`start`)
        self.engines: set[str] = set()
        self.key: tuple[str, str] | None = None  # the base file it serves, once taken
        self.stopping = False
        self.on_exit: Callable[[Host, int], None] = lambda host, code: None
        self.watch: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def client(self) -> httpx.AsyncClient:
        """The HTTP client over its socket (a host `start` returned has one)."""
        assert self._client is not None
        return self._client

    @classmethod
    async def start(cls) -> Host:
        """A new host, once it listens (RuntimeError if it cannot start)."""
        folder = tempfile.mkdtemp(prefix="loraserve-host-")  # mode 0700: ours alone
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "loraserve.server.router.host",
            os.path.join(folder, "host.sock"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        host = cls(proc, folder)
        # httpx (and the trio that httpcore imports when installed: ~0.3 s) is imported in a
        # thread while the child starts, not on the event loop: the router's first answers
        # (its start's /health) would wait for it
        importing = asyncio.ensure_future(asyncio.to_thread(importlib.import_module, "httpx"))
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        except asyncio.CancelledError:  # the router ended while it started: end and reap it
            await host.stop()
            raise
        if line.strip() != b"ready":
            await host.stop()
            why = describe_exit(proc.returncode)
            raise RuntimeError(f"the engine process did not start ({why})")
        httpx = await importing
        transport = httpx.AsyncHTTPTransport(uds=host.sock)
        host._client = httpx.AsyncClient(transport=transport, base_url="http://host", timeout=None)
        host.watch = asyncio.get_running_loop().create_task(host._watch())
        return host

    async def _watch(self) -> None:
        code = await self.proc.wait()
        if not self.stopping:
            log.error("router: engine process %d died (%s)", self.pid, describe_exit(code))
        self.on_exit(self, code)
        await self.client.aclose()
        with contextlib.suppress(OSError):
            os.unlink(self.sock)
            os.rmdir(self.folder)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self.stopping

    async def _call(
        self, route: str, body: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        import httpx

        try:
            r = await self.client.post(f"/_host/{route}", json=body, timeout=timeout)
            out: dict[str, Any] = r.json()
        except (httpx.HTTPError, ValueError) as e:
            out = {"error": f"the engine process is gone ({describe_exit(self.proc.returncode)})"}
            log.debug("router: host %d: %s: %s", self.pid, route, e)
        return out

    async def load(self, eid: str, cfg: object) -> dict[str, int]:
        """Load engine `eid` here; its model's sizes (RuntimeError with the host's reason)."""
        self.engines.add(eid)
        out = await self._call(
            "load", {"id": eid, "cfg": base64.b64encode(pickle.dumps(cfg)).decode()}
        )
        if "error" in out:
            self.engines.discard(eid)
            raise RuntimeError(out["error"])
        return dict(out["meta"])

    async def unload(self, eid: str) -> None:
        self.engines.discard(eid)
        if self.alive:
            await self._checked("unload", {"id": eid})

    async def abort(self, eid: str, message: str) -> None:
        if self.alive:
            await self._checked("abort", {"id": eid, "message": message})

    async def _checked(self, route: str, body: dict[str, Any]) -> None:
        """A control call that must answer in CONTROL_TIMEOUT_S: a host that does not is
        stuck (a deadlock, a stopped process) and is killed, its engines failed with it."""
        out = await self._call(route, body, CONTROL_TIMEOUT_S)
        if "error" in out and self.alive:
            log.error("router: engine process %d: %s: %s; killing it", self.pid, route, out)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def stop(self) -> None:
        """End the process: its stdin closes (it shuts its engines down), then SIGKILL."""
        self.stopping = True
        if self.proc.returncode is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self.watch is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.watch
        elif self._client is not None:
            await self._client.aclose()


class ProxyApp:
    """A hosted engine as an ASGI app (see the module docstring)."""

    def __init__(self, host: Host, eid: str) -> None:
        self.host, self.eid = host, eid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = []
        while True:
            msg = await receive()
            body.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        ours = HOP | {ENGINE_HEADER, PEER_HEADER}  # a client's own copies are dropped
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in ours]
        headers += [(ENGINE_HEADER, self.eid.encode())]
        if scope.get("client"):
            headers.append((PEER_HEADER, str(scope["client"][0]).encode()))
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        req = self.host.client.build_request(
            scope["method"],
            "http://host" + target.decode("latin-1"),
            headers=headers,
            content=b"".join(body),
        )
        relay = asyncio.ensure_future(self._relay(req, send))
        left = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait({relay, left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relay, left):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        if relay.done() and not relay.cancelled() and relay.exception() is not None:
            raise relay.exception()  # type: ignore[misc]

    async def _relay(self, req: httpx.Request, send: Send) -> None:
        import httpx

        started = False
        try:
            async with contextlib.aclosing(self._stream(req)) as chunks:
                async for status, headers, chunk in chunks:
                    if not started:
                        started = True
                        await send(
                            {"type": "http.response.start", "status": status, "headers": headers}
                        )
                    if chunk:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as e:
            log.warning("router: engine process %d: %s: %r", self.host.pid, req.url.path, e)
            if not started:
                why = describe_exit(self.host.proc.returncode)
                raw = json.dumps(
                    {
                        "error": {
                            "code": 500,
                            "message": f"the model's engine process ended ({why})",
                            "type": "server_error",
                        }
                    }
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": raw})
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, req: httpx.Request) -> Any:
        resp = await self.host.client.send(req, stream=True)
        try:
            headers = [(k, v) for k, v in resp.headers.raw if k.lower() not in HOP]
            if "content-length" in resp.headers and "transfer-encoding" not in resp.headers:
                headers.append((b"content-length", resp.headers["content-length"].encode()))
            yield resp.status_code, headers, b""
            async for chunk in resp.aiter_raw():
                yield resp.status_code, headers, chunk
        finally:
            await resp.aclose()


async def _disconnect(receive: Receive) -> None:
    """Returns once the client has left (its `http.disconnect`)."""
    while (await receive())["type"] != "http.disconnect":
        pass
