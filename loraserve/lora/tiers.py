"""Memory tiers of adapters: which resident adapters make room for a load, and the counters.

An adapter is *resident* (its weights in memory) or *on disk* (registered, with its id,
name, path, global scale and last content identity, but no weights). `--lora-max-loaded N`
bounds the resident adapters, `--lora-max-memory MiB` their weight bytes; past a bound,
the least recently used resident adapters go back to disk, never one that a queued,
running or waiting request uses and never a pinned one (`--lora` adapters and
``pinned`` loads). An adapter on disk is read again on its next use; its KV stays in the
prefix cache under its content identity, so an unchanged file finds its prefixes warm.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loraserve.lora.adapter import Adapter


@dataclass(frozen=True)
class TierLimits:
    """Bounds on the resident adapters: their number and their weight bytes (None: none)."""

    max_loaded: int | None = None
    max_bytes: int | None = None

    def over(self, n: int, nbytes: int) -> bool:
        """Whether ``n`` resident adapters of ``nbytes`` in all exceed a bound."""
        return (self.max_loaded is not None and n > self.max_loaded) or (
            self.max_bytes is not None and nbytes > self.max_bytes
        )


@dataclass
class TierStats:
    """Counters since start (`/metrics`): loads (successful reads of a file), failed
    loads, evictions, the seconds the loads took, and the loads that found their weights
    already resident under another name (same content: no second copy)."""

    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    load_seconds: float = 0.0
    shared_loads: int = 0


def adapter_bytes(a: Adapter) -> int:
    """The bytes an adapter's weights hold in memory (0 on disk)."""
    return a.nbytes


def victims(
    adapters: Iterable[Adapter],
    in_use: set[int],
    limits: TierLimits,
    incoming: int = 0,
    incoming_bytes: int = 0,
) -> list[Adapter]:
    """The resident adapters to evict, least recently used first, so that the resident
    ones plus ``incoming`` adapters of ``incoming_bytes`` fit ``limits``; only idle,
    unpinned adapters are chosen, so the result may leave them over the limits."""
    resident = [a for a in adapters if a.weights]
    n = len(resident) + incoming
    nbytes = sum(resident_bytes(resident)) + incoming_bytes
    out: list[Adapter] = []
    for a in sorted(resident, key=lambda a: a.last_used):
        if not limits.over(n, nbytes):
            break
        if a.pinned or a.id in in_use:
            continue
        out.append(a)
        n -= 1
        nbytes -= _unique_bytes(a, resident, out)
    return out


def resident_bytes(resident: list[Adapter]) -> list[int]:
    """Each content's bytes once: adapters of one content share their weights."""
    seen: dict[str, int] = {}
    for a in resident:
        seen.setdefault(a.content_id, adapter_bytes(a))
    return list(seen.values())


def _unique_bytes(a: Adapter, resident: list[Adapter], gone: list[Adapter]) -> int:
    """The bytes evicting ``a`` frees: its weights unless a staying adapter shares them."""
    staying = [b for b in resident if b not in gone and b.content_id == a.content_id]
    return 0 if staying else adapter_bytes(a)
