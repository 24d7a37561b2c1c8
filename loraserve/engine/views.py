"""What the engine shows outside, as plain snapshots taken on the engine thread: each
slot (`/slots`) and the engine's counters and gauges (`/metrics`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from loraserve.cache.prefix_cache import CacheStats
from loraserve.engine.core import EngineCore
from loraserve.engine.request import Request
from loraserve.engine.scheduler import Scheduler
from loraserve.lora.tiers import TierStats


@dataclass(frozen=True)
class SlotView:
    """One slot: its running request (else the last one it ran, or None), the tokens it
    holds or retains, and how many it has generated for the running request."""

    id: int
    busy: bool
    request: Request | None
    n_tokens: int
    n_decoded: int


@dataclass(frozen=True)
class EngineStats:
    """Requests running and waiting, KV blocks, prefix-cache statistics, adapter names."""

    processing: int
    deferred: int
    blocks_used: int
    blocks_max: int
    blocks_cached: int
    blocks_free: int
    block_size: int
    cache: CacheStats
    adapter_names: dict[int, str]
    n_forward: int = 0  # forward passes so far
    n_busy_rows: int = 0  # sequences summed over those passes
    tiers: TierStats = field(default_factory=TierStats)  # adapter loads and evictions
    lora_registered: int = 0  # adapters registered (resident or on disk)
    lora_resident: int = 0  # adapters whose weights are in memory
    lora_resident_bytes: int = 0  # their weights' bytes (shared weights once)


def slot_views(scheduler: Scheduler) -> list[SlotView]:
    """Engine thread: every slot, in id order."""
    out = []
    for slot in scheduler.slots:
        run = slot.run
        out.append(
            SlotView(
                id=slot.id,
                busy=run is not None,
                request=run.req if run is not None else slot.last_request,
                n_tokens=len(run.tokens) if run is not None else len(slot.tokens),
                n_decoded=len(run.generated) if run is not None else 0,
            )
        )
    return out


def engine_stats(core: EngineCore) -> EngineStats:
    """Engine thread: the counters and gauges of `EngineStats`."""
    scheduler, pool, cache, reg = core.scheduler, core.pool, core.cache, core.adapters
    s = cache.stats
    return EngineStats(
        processing=len(scheduler.running),
        deferred=len(scheduler.waiting),
        blocks_used=pool.num_used,
        blocks_max=pool.max_blocks,
        blocks_cached=cache.num_cached(),
        blocks_free=pool.num_free,
        block_size=pool.block_size,
        cache=CacheStats(s.hits, s.misses, s.hit_tokens, s.evictions),
        adapter_names={a.id: a.name for a in core.adapters.list()},
        n_forward=core.n_forward,
        n_busy_rows=core.n_busy_rows,
        tiers=replace(reg.stats),
        lora_registered=len(reg.list()),
        lora_resident=len(reg.resident),
        lora_resident_bytes=reg.resident_bytes,
    )
