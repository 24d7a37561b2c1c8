"""Routing by adapter configuration: a request's routing key is the canonical cache key of
its effective mix (`RouteTable`, the engine's own `AdapterRegistry.mix` over the replicas'
adapter table), and `AffinityRouter`, a Ray Serve request router, sends each key to one
replica, the next ranks taking the spill-over when that replica is saturated
(`max_ongoing_requests`). The replica of a key is kept by `Balancer`: bounded-load
rendezvous hashing, so that with K keys active in the last minute and R replicas no replica
holds more than ceil(K / R) of them weighted by their recent traffic (four adapter mixes of
equal traffic on two replicas land two and two; a hot one counts for more), each key
staying where it was first placed while it is active (its KV stays warm there).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from loraserve.lora.catalogue import Catalogue
from loraserve.lora.registry import AdapterRegistry

BASE_KEY = "base"  # the routing key of the base model's mix (the empty cache key)


@dataclass
class _Entry:
    """What the registry's mix needs of an adapter."""

    id: int
    name: str
    content_id: str  # "" for an adapter registered on disk and never read yet
    path: str = ""


class RouteTable(AdapterRegistry):
    """The replicas' adapters and global scales, without weights: `key` computes a
    request's mix exactly as a replica's engine will (`AdapterRegistry.mix`)."""

    def __init__(self, table: list[dict[str, Any]]) -> None:  # no model: mixes only
        self._adapters = {a["id"]: _Entry(a["id"], a["name"], a["content_id"]) for a in table}
        self.catalogue = Catalogue()  # names the replicas never registered: no adapter
        self._global = {a["id"]: float(a["scale"]) for a in table}
        self._next_id = max(self._adapters, default=-1) + 1

    def key(self, body: bytes) -> str:
        """The routing key of a request body: a digest of its mix's cache key, `BASE_KEY`
        for the base model, "" when the body names no valid mix (any replica answers the
        400 it gets)."""
        try:
            data = json.loads(body) if body else {}
            lora = data.get("lora") if isinstance(data, dict) else None
            items = [(_ref(x), float(x["scale"])) for x in lora] if lora else None
            model = data.get("model") if isinstance(data, dict) else None
            mix = self.mix(items, model if isinstance(model, str) else None)
        except (ValueError, TypeError, KeyError, AttributeError):
            return ""
        if not mix.cache_key:
            return BASE_KEY
        return hashlib.sha256(repr(mix.cache_key).encode()).hexdigest()[:16]


def _ref(item: dict[str, Any]) -> int | str:
    """A `lora` entry's adapter: its id, or its name."""
    return int(item["id"]) if "id" in item else str(item["name"])


def rank(key: str, replica_ids: list[str]) -> list[str]:
    """Replica ids in rendezvous order for ``key`` (highest hash of key and id first)."""

    def weight(rid: str) -> bytes:
        return hashlib.sha256(f"{key}\x00{rid}".encode()).digest()

    return sorted(replica_ids, key=weight, reverse=True)


@dataclass
class _Placed:
    """A routing key's replica, when the key was last used, and its recent traffic: its
    requests, each decayed with time constant ``tau`` (seconds) since it came, at ``last``."""

    replica: str
    last: float
    traffic: float = 0.0

    def at(self, now: float, tau: float) -> float:
        """The traffic decayed to ``now``."""
        return self.traffic * math.exp(-(now - self.last) / tau)


class Balancer:
    """Each active routing key's replica. A key keeps its replica while it stays active
    (used within ``window_s``) and that replica is there. A new key goes to the first
    replica in its rendezvous order (`rank`) whose keys, weighted by their recent traffic,
    leave room for one more key under ceil(K / R) (K active keys, itself included, R
    replicas); a key's weight is its traffic over the mean key's (the K keys weigh K in
    all, each 1 under equal traffic, so a replica holds at most ceil(K / R) keys then).
    When no replica has room (a few keys carry most of the traffic), the least loaded one
    takes it."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.tau = window_s / 2  # traffic's time constant
        self._where: dict[str, _Placed] = {}

    def order(self, key: str, replica_ids: list[str], now: float | None = None) -> list[str]:
        """The replicas for ``key``, its own first, then the rest in rendezvous order; the
        request is counted in ``key``'s traffic."""
        now = time.monotonic() if now is None else now
        live = set(replica_ids)
        self._where = {
            k: p
            for k, p in self._where.items()
            if p.replica in live and now - p.last <= self.window_s
        }
        ranked = rank(key, replica_ids)
        placed = self._where.get(key)
        if placed is None and ranked:
            placed = _Placed(self._place(ranked, now), now)
        if placed is None:
            return ranked
        placed.traffic = placed.at(now, self.tau) + 1.0
        placed.last = now
        self._where[key] = placed
        return [placed.replica, *(r for r in ranked if r != placed.replica)]

    def loads(self, now: float) -> Counter[str]:
        """Each replica's active keys weighted by their recent traffic (mean key: 1)."""
        traffic = {k: p.at(now, self.tau) for k, p in self._where.items()}
        mean = sum(traffic.values()) / len(traffic) if traffic else 1.0
        out: Counter[str] = Counter()
        for k, p in self._where.items():
            out[p.replica] += traffic[k] / mean if mean > 0 else 1.0
        return out

    def _place(self, ranked: list[str], now: float) -> str:
        load = self.loads(now)
        cap = math.ceil((len(self._where) + 1) / len(ranked))
        fits = [r for r in ranked if load[r] + 1.0 <= cap + 1e-9]
        return fits[0] if fits else min(ranked, key=lambda r: load[r])


class AffinityRouter(RequestRouter):
    """Ray Serve's router for the replica deployment: ``mode="affinity"`` orders replicas
    by `Balancer.order` of the request's multiplexed model id (its routing key); a request without
    one, or every request with ``mode="round_robin"``, starts at the next replica in turn."""

    mode = "affinity"
    _turn = itertools.count()
    _balancer = Balancer()

    def initialize_state(self, mode: str = "affinity", **kwargs: Any) -> None:
        """Ray Serve passes `request_router_kwargs` here."""
        if mode not in ("affinity", "round_robin"):
            raise ValueError(f"routing mode must be affinity or round_robin, got {mode!r}")
        self.mode = mode
        self._turn = itertools.count()
        self._balancer = Balancer()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """One rank per replica, the preferred first: Ray Serve sends the request to the
        first rank whose replica is below its `max_ongoing_requests`."""
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        key = pending_request.metadata.multiplexed_model_id if pending_request else ""
        if key and self.mode == "affinity":
            order = self._balancer.order(key, list(by_id))
        else:
            ids = sorted(by_id)
            start = next(self._turn) % len(ids) if ids else 0
            order = ids[start:] + ids[:start]
        return [[by_id[rid]] for rid in order]
