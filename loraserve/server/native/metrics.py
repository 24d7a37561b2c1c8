"""`GET /metrics` (with `--metrics`): Prometheus text with llama-server's `llamacpp:` names,
plus **ours**: per-adapter request, token and speculative-acceptance counters, prefix-cache
hit/miss/eviction counters and KV block gauges (`loraserve:` names).

Counters are fed by an engine listener (on the engine thread, one lock); gauges and the
cache statistics are the engine's snapshot at scrape time (`Engine.stats`).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from fastapi import APIRouter
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
        self.started = time.time()
        self.totals: dict[str, float] = defaultdict(float)
        self.adapters: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._bucket: dict[str, float] = defaultdict(float)  # since the last scrape

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
            n_tokens = run.n_prompt + len(run.generated)
            self.totals["n_tokens_max"] = max(self.totals["n_tokens_max"], n_tokens)
            b = self._bucket
            b["prompt_tokens"] += prompt_n
            b["prompt_seconds"] += t.prompt_ms / 1000
            b["predicted_tokens"] += max(len(run.generated) - 1, 0)
            b["predicted_seconds"] += t.predicted_ms / 1000
            n_drafts = run.spec.n_verified if run.spec is not None else 0
            self.totals["draft_tokens"] += t.draft_n
            self.totals["draft_accepted"] += t.draft_n_accepted
            self.totals["drafts"] += n_drafts
            for i in run.req.mix.scales:
                per = self.adapters[i]
                per["requests"] += 1
                per["prompt_tokens"] += prompt_n
                per["draft_tokens"] += t.draft_n
                per["draft_accepted"] += t.draft_n_accepted

    def take_rates(self) -> tuple[float, float]:
        """Prompt and generation tokens/s of the requests finished since the last call."""
        with self._lock:
            b, self._bucket = self._bucket, defaultdict(float)

        def rate(n: str, s: str) -> float:
            return b[n] / b[s] if b[s] > 0 else 0.0

        return rate("prompt_tokens", "prompt_seconds"), rate(
            "predicted_tokens", "predicted_seconds"
        )

    def snapshot(self) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
        with self._lock:
            return dict(self.totals), {i: dict(v) for i, v in self.adapters.items()}


Item = tuple[str, str, str, float]  # (kind, name, help, value)


def _items(
    totals: dict[str, float],
    rates: tuple[float, float],
    per: dict[int, dict[str, float]],
    view: EngineStats,
) -> list[Item]:
    c = view.cache
    used = view.blocks_used
    t = totals.get
    counters = [
        (
            "llamacpp:prompt_tokens_total",
            "Prompt tokens processed, excluding cached tokens",
            t("prompt_tokens", 0),
        ),
        (
            "llamacpp:prompt_tokens_cached_total",
            "Prompt tokens reused from the cache",
            t("cached_prompt_tokens", 0),
        ),
        (
            "llamacpp:prompt_seconds_total",
            "Total time spent processing prompts",
            t("prompt_seconds", 0),
        ),
        ("llamacpp:tokens_predicted_total", "Generation tokens", t("tokens_predicted", 0)),
        (
            "llamacpp:tokens_predicted_seconds_total",
            "Total time spent generating tokens",
            t("predicted_seconds", 0),
        ),
        ("llamacpp:n_decode_total", "Forward passes run", view.n_forward),
        (
            "llamacpp:n_tokens_max",
            "Largest sequence length seen (prompt + generation)",
            t("n_tokens_max", 0),
        ),
        (
            "llamacpp:spec_decode_num_draft_tokens_total",
            "Speculative: draft tokens verified",
            t("draft_tokens", 0),
        ),
        (
            "llamacpp:spec_decode_num_accepted_tokens_total",
            "Speculative: draft tokens accepted",
            t("draft_accepted", 0),
        ),
        ("llamacpp:spec_decode_num_drafts_total", "Speculative: verifications", t("drafts", 0)),
        ("loraserve:requests_finished_total", "Requests finished", t("requests_ok", 0)),
        (
            "loraserve:requests_failed_total",
            "Requests failed in the engine",
            t("requests_error", 0),
        ),
        ("loraserve:cache_hits_total", "Prefix-cache lookups that reused tokens", c.hits),
        ("loraserve:cache_misses_total", "Prefix-cache lookups that reused nothing", c.misses),
        ("loraserve:cache_hit_tokens_total", "Tokens found by prefix-cache lookups", c.hit_tokens),
        ("loraserve:cache_evictions_total", "KV blocks evicted from the prefix cache", c.evictions),
        ("loraserve:lora_loads_total", "Adapter files read into memory", view.tiers.loads),
        (
            "loraserve:lora_load_failures_total",
            "Adapter reads that failed",
            view.tiers.load_failures,
        ),
        (
            "loraserve:lora_load_seconds_total",
            "Time spent reading adapter files (off the engine thread)",
            view.tiers.load_seconds,
        ),
        (
            "loraserve:lora_evictions_total",
            "Adapters evicted from memory (--lora-max-loaded, --lora-max-memory)",
            view.tiers.evictions,
        ),
    ]
    gauges = [
        (
            "llamacpp:prompt_tokens_seconds",
            "Prompt throughput in tokens/s since the last scrape",
            rates[0],
        ),
        (
            "llamacpp:predicted_tokens_seconds",
            "Generation throughput in tokens/s since the last scrape",
            rates[1],
        ),
        ("llamacpp:requests_processing", "Requests processing", view.processing),
        ("llamacpp:requests_deferred", "Requests deferred", view.deferred),
        (
            "llamacpp:n_busy_slots_per_decode",
            "Average busy slots per forward pass",
            view.n_busy_rows / max(view.n_forward, 1),
        ),
        (
            "llamacpp:kv_cache_usage_ratio",
            "KV-cache usage, 1 = full",
            used / max(view.blocks_max, 1),
        ),
        ("llamacpp:kv_cache_tokens", "KV-cache tokens", used * view.block_size),
        ("loraserve:kv_blocks_used", "KV blocks held by slots or the cache", used),
        ("loraserve:kv_blocks_cached", "KV blocks held only by the cache", view.blocks_cached),
        ("loraserve:kv_blocks_free", "KV blocks free", view.blocks_free),
        (
            "loraserve:lora_registered",
            "Adapters registered, in memory or on disk",
            view.lora_registered,
        ),
        ("loraserve:lora_resident", "Adapters whose weights are in memory", view.lora_resident),
        (
            "loraserve:lora_resident_bytes",
            "Bytes of adapter weights in memory",
            view.lora_resident_bytes,
        ),
    ]
    return [("counter", *x) for x in counters] + [("gauge", *x) for x in gauges]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(items: list[Item], per: dict[int, dict[str, float]], names: dict[int, str]) -> str:
    """Prometheus text, as llama-server writes it: HELP, TYPE and the sample under the same
    name (counters end in ``_total``); per-adapter counters labelled by id and name."""
    lines: list[str] = []
    for kind, name, doc, value in items:
        lines += [f"# HELP {name} {doc}.", f"# TYPE {name} {kind}", f"{name} {float(value):g}"]
    for key, doc in PER_ADAPTER:
        name = f"loraserve:adapter_{key}_total"
        lines += [f"# HELP {name} {doc} per adapter.", f"# TYPE {name} counter"]
        for i, values in sorted(per.items()):
            labels = f'id="{i}",name="{_label(names.get(i, ""))}"'
            lines.append(f"{name}{{{labels}}} {float(values.get(key, 0)):g}")
    return "\n".join(lines) + "\n"


PER_ADAPTER = (
    ("requests", "Requests finished"),
    ("prompt_tokens", "Prompt tokens evaluated"),
    ("tokens_predicted", "Tokens generated"),
    ("draft_tokens", "Speculative draft tokens verified"),
    ("draft_accepted", "Speculative draft tokens accepted"),
)


@router.get("/metrics")
async def metrics(request: HttpRequest) -> Response:
    """Prometheus text exposition (501 without `--metrics`); the throughput gauges cover
    the time since the previous scrape (llama-server's buckets)."""
    state = get_state(request)
    if not state.cfg.metrics:
        raise not_supported(
            "This server does not support metrics endpoint. Start it with `--metrics`"
        )
    view = await wait(state.require().stats())
    stats: Metrics = request.app.state.metrics
    totals, per = stats.snapshot()
    text = render(_items(totals, stats.take_rates(), per, view), per, view.adapter_names)
    response = Response(text, media_type=CONTENT_TYPE)
    # named as llama-server writes it (starlette would lowercase it)
    response.raw_headers.append((b"Process-Start-Time-Unix", str(int(stats.started)).encode()))
    return response
