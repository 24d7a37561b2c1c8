"""A slot (`-np`): one concurrent sequence position, and what it retains of its last sequence
when idle (its tokens, their KV blocks, its cache key, the live recurrent state that follows
them); owned by `scheduler.Scheduler`."""

from __future__ import annotations

from dataclasses import dataclass, field

from loraserve.cache.prefix_cache import CacheKey, Spans
from loraserve.engine.request import Request, Run


@dataclass
class Slot:
    """A concurrent sequence position (`-np`), retaining its last sequence when idle."""

    id: int
    run: Run | None = None
    cache_key: CacheKey | Spans = ()
    tokens: list[int] = field(default_factory=list)  # tokens whose KV `blocks` hold
    blocks: list[int] = field(default_factory=list)
    last_used: float = 0.0
    last_request: Request | None = None
    # the request whose live recurrent state follows `tokens` (this very list: a slot
    # restored or erased gets another one), for `Scheduler._live_match`
    live: tuple[int, list[int]] | None = None

    @property
    def busy(self) -> bool:
        return self.run is not None
