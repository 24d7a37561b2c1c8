"""`GET /metrics` (with `--metrics`): Prometheus text with llama-server's `llamacpp:` names,
plus **ours**: per-adapter request and token counters, prefix-cache hit/miss/eviction
counters and KV block gauges (`loraserve:` names).

Counters are fed by an engine listener (on the engine thread, one lock); gauges and the
cache statistics are the engine's snapshot at scrape time (`Engine.stats`).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator

from fastapi import APIRouter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily as C
from prometheus_client.core import GaugeMetricFamily as G
from prometheus_client.core import Metric
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.engine.request import Event, Run
from loraserve.engine.views import EngineStats
from loraserve.server.errors import not_supported
from loraserve.server.flight import wait
from loraserve.server.state import get_state

router = APIRouter()
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Totals since start; `listener` is an engine listener (see `Engine.listeners`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals: dict[str, float] = defaultdict(float)
        self.adapters: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def listener(self, run: Run, ev: Event) -> None:
        with self._lock:
            if ev.token is not None:
                self.totals["tokens_predicted"] += 1
                for i in run.req.mix.scales:
                    self.adapters[i]["tokens_predicted"] += 1
            if not ev.done:
                return
            t = run.timings
            prompt_n = run.n_prompt - run.n_cached
            self.totals["requests_error" if ev.error else "requests_ok"] += 1
            self.totals["prompt_tokens"] += prompt_n
            self.totals["prompt_seconds"] += t.prompt_ms / 1000
            self.totals["predicted_seconds"] += t.predicted_ms / 1000
            self.totals["cached_prompt_tokens"] += run.n_cached
            for i in run.req.mix.scales:
                self.adapters[i]["requests"] += 1
                self.adapters[i]["prompt_tokens"] += prompt_n

    def snapshot(self) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
        with self._lock:
            return dict(self.totals), {i: dict(v) for i, v in self.adapters.items()}


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def _families(
    totals: dict[str, float], per: dict[int, dict[str, float]], view: EngineStats
) -> list[Metric]:
    def rate(n: str, s: str) -> float:
        return totals.get(n, 0) / totals[s] if totals.get(s, 0) > 0 else 0.0

    c = view.cache
    hits, misses, hit_tokens, evictions = c.hits, c.misses, c.hit_tokens, c.evictions
    used = view.blocks_used
    table: list[tuple[type, str, str, float]] = [
        (C, "llamacpp:prompt_tokens", "Prompt tokens processed.", totals.get("prompt_tokens", 0)),
        (C, "llamacpp:prompt_seconds", "Prompt process time.", totals.get("prompt_seconds", 0)),
        (C, "llamacpp:tokens_predicted", "Generation tokens.", totals.get("tokens_predicted", 0)),
        (
            C,
            "llamacpp:tokens_predicted_seconds",
            "Predict time.",
            totals.get("predicted_seconds", 0),
        ),
        (
            G,
            "llamacpp:prompt_tokens_seconds",
            "Average prompt tokens/s.",
            rate("prompt_tokens", "prompt_seconds"),
        ),
        (
            G,
            "llamacpp:predicted_tokens_seconds",
            "Average generation tokens/s.",
            rate("tokens_predicted", "predicted_seconds"),
        ),
        (G, "llamacpp:requests_processing", "Requests processing.", view.processing),
        (G, "llamacpp:requests_deferred", "Requests deferred.", view.deferred),
        (
            G,
            "llamacpp:kv_cache_usage_ratio",
            "KV-cache usage, 1 = full.",
            used / max(view.blocks_max, 1),
        ),
        (G, "llamacpp:kv_cache_tokens", "KV-cache tokens.", used * view.block_size),
        (C, "loraserve:requests_finished", "Requests finished.", totals.get("requests_ok", 0)),
        (
            C,
            "loraserve:requests_failed",
            "Requests failed in the engine.",
            totals.get("requests_error", 0),
        ),
        (
            C,
            "loraserve:prompt_tokens_cached",
            "Prompt tokens reused from the prefix cache.",
            totals.get("cached_prompt_tokens", 0),
        ),
        (C, "loraserve:cache_hits", "Prefix-cache lookups that reused tokens.", hits),
        (C, "loraserve:cache_misses", "Prefix-cache lookups that reused nothing.", misses),
        (C, "loraserve:cache_hit_tokens", "Tokens found by prefix-cache lookups.", hit_tokens),
        (C, "loraserve:cache_evictions", "KV blocks evicted from the prefix cache.", evictions),
        (G, "loraserve:kv_blocks_used", "KV blocks held by slots or the cache.", used),
        (
            G,
            "loraserve:kv_blocks_cached",
            "KV blocks held only by the cache.",
            view.blocks_cached,
        ),
        (G, "loraserve:kv_blocks_free", "KV blocks free.", view.blocks_free),
    ]
    out: list[Metric] = [kind(name, doc, value=value) for kind, name, doc, value in table]
    labels = ["id", "name"]
    per_adapter = {
        key: C(f"loraserve:adapter_{key}", f"{doc} per adapter.", labels=labels)
        for key, doc in (
            ("requests", "Requests finished"),
            ("prompt_tokens", "Prompt tokens evaluated"),
            ("tokens_predicted", "Tokens generated"),
        )
    }
    for i, values in sorted(per.items()):
        name = view.adapter_names.get(i, "")
        for key, fam in per_adapter.items():
            fam.add_metric([str(i), name], values.get(key, 0))
    return out + list(per_adapter.values())


@router.get("/metrics")
async def metrics(request: HttpRequest) -> Response:
    """Prometheus text exposition (501 without `--metrics`)."""
    state = get_state(request)
    if not state.cfg.metrics:
        raise not_supported(
            "This server does not support metrics endpoint. Start it with `--metrics`"
        )
    view = await wait(state.require().stats())
    totals, per = request.app.state.metrics.snapshot()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(_families(totals, per, view)))  # type: ignore[arg-type]
    return Response(generate_latest(registry), media_type=CONTENT_TYPE)
