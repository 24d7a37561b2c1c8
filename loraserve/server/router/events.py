"""`GET /models/sse`: the router's model status changes as server-sent events, as
llama-server's router sends them (tools/server/server-models.cpp `notify_sse`): one
`data: {"model": id, "event": "status_change", "data": {"status": ..., "exit_code": n}}`
per change of a model's status (`loading`, `loaded`, `unloaded`; `exit_code` with
`unloaded`: 0, or 1 after a failed load), and `{"model": "*", "event": "models_reload"}`
when the sources are read again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

QUEUE_MAX = 256  # a subscriber that reads none of this many events is dropped


class ModelEvents:
    """Fan-out of router events to every connected `/models/sse` client (event loop only)."""

    def __init__(self) -> None:
        self._subs: set[asyncio.Queue[dict[str, Any] | None]] = set()

    def publish(self, model: str, event: str, data: dict[str, Any] | None = None) -> None:
        """Send one event to every subscriber (one that stopped reading is dropped)."""
        item: dict[str, Any] = {"model": model, "event": event}
        if data is not None:
            item["data"] = data
        for q in list(self._subs):
            try:
                q.put_nowait(item)
            except asyncio.QueueFull:
                self._subs.discard(q)  # its stream ends once it has read what it holds

    def close(self) -> None:
        """End every stream (the router's shutdown)."""
        for q in list(self._subs):
            try:
                q.put_nowait(None)
            except asyncio.QueueFull:
                pass
        self._subs.clear()

    async def stream(self) -> AsyncIterator[bytes]:
        """One client's events, as SSE lines, until the router shuts down (the response
        ends it when the client disconnects)."""
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(QUEUE_MAX)
        self._subs.add(q)
        try:
            yield b": subscribed\n\n"  # an SSE comment: every later event reaches this client
            while q in self._subs or not q.empty():
                item = await q.get()
                if item is None:
                    return
                yield f"data: {json.dumps(item)}\n\n".encode()
        finally:
            self._subs.discard(q)
