"""Admission control: a bounded queue, and the slots shared fairly between clients.

*Queued* requests are those submitted and not yet in a slot (waiting in the scheduler or
for an adapter read). `QueueBudget` bounds them (`--max-queue`): a submission that would
pass the bound is refused at once (`QueueFull`, a 503 with `Retry-After`), never queued.

*Fairness*: each request names its client (`Request.client`: an API key's digest or a peer
address). When slots free up, the waiting request admitted next is the oldest one of the
client holding the fewest slots (round-robin between clients; arrival order within a
client), so a client with many requests cannot keep every slot while another waits: each
slot it gives back goes to a client that holds fewer; between clients holding as many, the
one served least recently goes first (round-robin even with one slot). With one client
this is FIFO.

Invariant: `QueueBudget.queued` counts every submitted request, once, until it enters a
slot, is dropped (cancelled while waiting) or its submission is refused.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the router process imports QueueFull without torch
    from loraserve.engine.request import Request

RETRY_AFTER_S = 1  # what a refused client is told to wait (`Retry-After`)

# who is calling `Engine.submit` (set per HTTP request by the server's middleware): the
# defaults of a request's `client` and of its tenant salt under `--cache-isolation key`
current_client: ContextVar[str] = ContextVar("current_client", default="")
current_tenant: ContextVar[str] = ContextVar("current_tenant", default="")


class QueueFull(Exception):
    """A submission would pass the queue's bound (`--max-queue`)."""

    def __init__(self, queued: int, limit: int, n: int) -> None:
        super().__init__(
            f"the server is busy: {queued} requests are queued (--max-queue {limit}); "
            f"{n} more cannot wait, retry later"
        )
        self.retry_after_s = RETRY_AFTER_S


class QueueBudget:
    """The queued requests, counted against a bound (0: unbounded); thread-safe."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self._ids: set[int] = set()
        self._lock = threading.Lock()

    @property
    def queued(self) -> int:
        """Requests submitted and not yet in a slot (nor dropped)."""
        return len(self._ids)

    def reserve(self, reqs: Iterable[Request]) -> None:
        """Count ``reqs`` as queued, or raise `QueueFull` (then none is counted)."""
        ids = {r.id for r in reqs}
        with self._lock:
            if self.limit and len(self._ids) + len(ids) > self.limit:
                raise QueueFull(len(self._ids), self.limit, len(ids))
            self._ids |= ids

    def release(self, req: Request) -> None:
        """``req`` left the queue (admitted, dropped or refused); idempotent."""
        with self._lock:
            self._ids.discard(req.id)


def fair_order(
    waiting: Iterable[Request], held: Counter[str], served: dict[str, int]
) -> Iterator[Request]:
    """The waiting requests in the order to try them: the oldest request of the client that
    holds the fewest slots, then of the one served least recently (``served``: the turn of
    each client's last admission), then by arrival. ``held`` and ``served`` are updated by
    the caller as it admits; lazy, so each pick sees those updates, and a pick costs one
    pass over the clients, not over the requests."""
    queues: dict[str, deque[tuple[int, Request]]] = {}
    for i, req in enumerate(waiting):
        queues.setdefault(req.client, deque()).append((i, req))
    while queues:
        client = min(queues, key=lambda c: (held[c], served.get(c, -1), queues[c][0][0]))
        q = queues[client]
        yield q.popleft()[1]
        if not q:
            del queues[client]
