"""One replica: a whole loraserve server (`create_app`, the same code and flags as
`loraserve serve`) inside a Ray Serve replica, answering the HTTP calls the ingress routes
to it (`handle`) and following the coordinator's inbox for the global ones.

Start-up, in the replica's constructor (Ray marks it running only after): load the model
and the `--lora` adapters, replay the coordinator's log of global calls, register, replay
what was logged meanwhile, then follow the inbox. So a replica that Ray starts to replace
a dead one serves under the same adapters, ids and scales as the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import ray
import torch
from ray import serve
from ray.exceptions import RayActorError

from loraserve.cluster.asgi_host import AppHost, HttpAnswer, HttpCall
from loraserve.server.app import create_app
from loraserve.server.config.args import parse_server_args
from loraserve.server.startup import check_files
from loraserve.server.state import ServerState

log = logging.getLogger("loraserve.cluster")
LOAD_TIMEOUT_S = 600.0
REPLICA_MESSAGE = "loraserve.replica"  # the first message of every answer: who serves it


class Replica:
    """A Ray Serve replica running one loraserve server on its own event loop."""

    def __init__(self, argv: list[str], coordinator: str, namespace: str) -> None:
        cfg = parse_server_args(argv)
        check_files(cfg)
        if cfg.n_threads > 0:
            torch.set_num_threads(cfg.n_threads)
        self.app = create_app(cfg)
        self.state: ServerState = self.app.state.server
        self.host = AppHost(self.app)
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while self.state.engine is None:
            if self.state.load_error:
                raise RuntimeError(f"cannot start: {self.state.load_error}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the model did not load in {LOAD_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        self.id = serve.get_replica_context().replica_id.unique_id
        self.coordinator = ray.get_actor(coordinator, namespace=namespace)
        self.applied = 0  # logged global calls applied, in order
        while calls := ray.get(self.coordinator.log_since.remote(self.applied)):
            self._apply_all(calls)
        self._register()
        self.host.submit(self._follow())
        log.info("replica %s ready", self.id)

    def _apply_all(self, calls: list[HttpCall | None]) -> None:
        for call in calls:
            if call is None:  # a write every replica refused
                self.applied += 1
                continue
            answer = self.host.submit(self.host.answer(call)).result()
            if answer.status >= 400:
                log.warning(
                    "replaying %s %s: %d %s",
                    call.method,
                    call.path,
                    answer.status,
                    answer.body[:200],
                )
            self.applied += 1

    def _register(self) -> None:
        handle = ray.get_runtime_context().current_actor
        table = self.host.submit(self.table()).result()
        missed = ray.get(self.coordinator.register.remote(self.id, handle, self.applied, table))
        self._apply_all(missed)

    async def table(self) -> list[dict[str, Any]]:
        """The adapter table the ingress routes with: GET /lora-adapters plus content ids."""
        listed = await asyncio.wrap_future(self.state.require().list_adapters())
        return [
            {"id": a.id, "name": a.name, "scale": s, "content_id": a.content_id} for a, s in listed
        ]

    async def _follow(self) -> None:
        """App loop: answer the coordinator's calls; logged ones in order, queries at once."""
        while True:
            try:
                items = await self.coordinator.next_items.remote(self.id)
            except RayActorError:
                log.warning("replica %s: the coordinator is gone", self.id)
                return
            if items is None:  # dropped as dead while busy: catch up and register again
                await asyncio.to_thread(self._register)
                continue
            for ticket, call, mode in items:
                if mode == "query":
                    asyncio.ensure_future(self._answer(ticket, call, False))
                else:
                    await self._answer(ticket, call, mode == "log")
                    self.applied += mode == "log"

    async def _answer(self, ticket: int, call: HttpCall, logged: bool) -> None:
        try:
            answer = await self.host.answer(call)
        except Exception as e:  # never leave the coordinator waiting
            answer = HttpAnswer(500, [], f"replica {self.id}: {e}".encode())
        table = await self.table() if logged else None
        await self.coordinator.done.remote(ticket, answer, table)

    async def handle(self, call: HttpCall) -> AsyncIterator[dict[str, Any]]:
        """The ASGI messages answering ``call``, after one naming this replica."""
        yield {"type": REPLICA_MESSAGE, "replica": self.id}
        async for message in self.host.call(call):
            yield message

    def check_health(self) -> None:
        """Ray Serve's periodic health check: the server must still have its engine."""
        if self.state.engine is None:
            raise RuntimeError(f"replica {self.id}: no engine ({self.state.load_error})")

    def __del__(self) -> None:
        """Ray Serve's shutdown of this replica: stop the server (and its engine)."""
        host = getattr(self, "host", None)
        if host is not None:
            host.close()
