"""The coordinator: one Ray actor that keeps the replicas' global adapter state coherent.

Every replica registers here once its server is up and then follows its inbox
(`next_items` / `done`). `broadcast` puts one HTTP call into the inbox of every live replica
and returns once each has answered it (or died), so `POST /lora-adapters`, `/load` and
`/unload` are acknowledged only after every replica applied them. A call's mode says how:
``log``, a global write: kept, in order, in the log (a replica that starts later, as Ray's
replacement for one that died, replays the log before it registers, so it serves under the
same adapters, ids and global scales as the others; a write that no replica accepted
stays in the log as None), and every replica applies it after the ordered calls before
it; ``ordered``, a read that every replica answers after those same writes (one
`GET /lora-adapters` snapshot); ``query``, answered at once (`/health`, `/metrics`).

A replica that does not answer is pinged through its actor handle; a dead one leaves the
registry (its answer is then missing) and `/health` reports fewer replicas than wanted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError

from loraserve.cluster.asgi_host import HttpAnswer, HttpCall

log = logging.getLogger("loraserve.cluster")
PING_AFTER_S = 2.0  # a replica silent this long is pinged
PING_TIMEOUT_S = 5.0
Table = list[dict[str, Any]]  # GET /lora-adapters of a replica, with each content_id


@dataclass
class _Replica:
    handle: Any  # the replica's Ray actor handle (for liveness only)
    inbox: list[tuple[int, HttpCall, str]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@ray.remote(num_cpus=0)
class Coordinator:
    """The replicas' registry, the log of global calls, and the adapter table."""

    def __init__(self, n_replicas: int) -> None:
        self.n_replicas = n_replicas
        self.replicas: dict[str, _Replica] = {}
        self.calls: list[HttpCall | None] = []
        self.table: Table = []
        self.table_version = 0
        self._table_changed = asyncio.Event()
        self._tickets = itertools.count()
        self._answers: dict[int, asyncio.Future[HttpAnswer]] = {}

    def log_since(self, n: int) -> list[HttpCall | None]:
        """The logged calls from position ``n`` on (a starting replica's replay)."""
        return self.calls[n:]

    def register(
        self, replica_id: str, handle: Any, applied: int, table: Table
    ) -> list[HttpCall | None]:
        """Add a replica that applied the first ``applied`` logged calls; returns the calls
        logged since (it applies them before serving). ``table`` is its adapter table."""
        self.replicas[replica_id] = _Replica(handle)
        if applied == len(self.calls):
            self._set_table(table)
        log.info(
            "replica %s registered (%d of %d)", replica_id, len(self.replicas), self.n_replicas
        )
        return self.calls[applied:]

    def _set_table(self, table: Table) -> None:
        if table != self.table or not self.table_version:
            self.table = table
            self.table_version += 1
            self._table_changed.set()
            self._table_changed = asyncio.Event()

    async def table_after(self, version: int, timeout_s: float = 30.0) -> tuple[int, Table]:
        """The adapter table once its version is past ``version`` (or after ``timeout_s``)."""
        if self.table_version <= version:
            try:
                await asyncio.wait_for(self._table_changed.wait(), timeout_s)
            except TimeoutError:
                pass
        return self.table_version, self.table

    def status(self) -> tuple[int, list[str]]:
        """The number of replicas wanted and the ids of those registered."""
        return self.n_replicas, sorted(self.replicas)

    async def next_items(self, replica_id: str) -> list[tuple[int, HttpCall, str]] | None:
        """A replica's waiting calls (ticket, call, mode), once there is one; None tells a
        replica that is not (or no longer) registered to stop following."""
        rep = self.replicas.get(replica_id)
        if rep is None:
            return None
        while not rep.inbox:
            rep.wake.clear()
            try:
                await asyncio.wait_for(rep.wake.wait(), 10.0)
            except TimeoutError:
                if self.replicas.get(replica_id) is not rep:
                    return None
        items, rep.inbox = rep.inbox, []
        return items

    def done(self, ticket: int, answer: HttpAnswer, table: Table | None = None) -> None:
        """A replica's answer to the call with ``ticket``; ``table`` its adapter table after
        a logged call."""
        fut = self._answers.pop(ticket, None)
        if fut is not None and not fut.done():
            fut.set_result(answer)
        if table is not None:
            self._set_table(table)

    async def broadcast(self, call: HttpCall, mode: str = "query") -> dict[str, HttpAnswer]:
        """Send ``call`` to every registered replica in ``mode`` (log, ordered, query);
        their answers by replica id, once all answered (a replica found dead meanwhile is
        dropped and has none)."""
        if mode not in ("log", "ordered", "query"):
            raise ValueError(f"mode: log, ordered or query, not {mode!r}")
        position = len(self.calls)
        if mode == "log":
            self.calls.append(call)
        pending: dict[str, tuple[_Replica, asyncio.Future[HttpAnswer]]] = {}
        loop = asyncio.get_running_loop()
        for rid, rep in self.replicas.items():
            ticket = next(self._tickets)
            fut = self._answers[ticket] = loop.create_future()
            pending[rid] = rep, fut
            rep.inbox.append((ticket, call, mode))
            rep.wake.set()
        answers: dict[str, HttpAnswer] = {}
        for rid, (rep, fut) in pending.items():
            answer = await self._await_alive(rid, rep, fut)
            if answer is not None:
                answers[rid] = answer
        if mode == "log" and not any(a.status < 300 for a in answers.values()):
            self.calls[position] = None  # refused everywhere: replays skip it
        return answers

    async def _await_alive(
        self, rid: str, rep: _Replica, fut: asyncio.Future[HttpAnswer]
    ) -> HttpAnswer | None:
        """The replica's answer; None once it is found dead or registered anew."""
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(fut), PING_AFTER_S)
            except TimeoutError:
                if self.replicas.get(rid) is not rep:
                    return None
                if not await self._alive(rep.handle):
                    log.warning("replica %s is gone: dropped from the registry", rid)
                    if self.replicas.get(rid) is rep:
                        self.replicas.pop(rid, None)
                    return None

    @staticmethod
    async def _alive(handle: Any) -> bool:
        try:
            await asyncio.wait_for(handle.__ray_ready__.remote(), PING_TIMEOUT_S)
        except RayActorError:
            return False
        except TimeoutError:
            return True  # busy, not dead: keep waiting
        return True

    async def sweep(self) -> None:
        """Drop every registered replica whose actor is dead (before counting them)."""
        for rid, rep in list(self.replicas.items()):
            if not await self._alive(rep.handle) and self.replicas.get(rid) is rep:
                log.warning("replica %s is gone: dropped from the registry", rid)
                self.replicas.pop(rid, None)
