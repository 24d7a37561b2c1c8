"""`bench.adapter_scale`'s report: the markdown table of its rows (one per server)."""

from __future__ import annotations

from typing import Any


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per server; each ratio is Zipf over single-adapter tok/s within
    the same server's rounds (median; first round; median of the later rounds; range)."""

    def f(v: Any, d: int = 2) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    out = [
        "| server | adapters | dtype | tok/s | single tok/s | vs 1 adapter median (first / "
        "steady) [range] | vs 1 adapter of the mean rank / of rank 16 (mean rank) | CPU a token, "
        "1 adapter / Zipf | TTFT resident p50/p95 s | "
        "TTFT cold p50/p95 s (n) | loads (s) / "
        "evictions | file MiB (cached) | resident MiB (n/budget) | peak RSS MiB (warm + KV "
        "max + adapter budget + in flight = bound) | finished | other cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        res, rng = r.get("resident_bytes"), r.get("ratio_range") or [None, None]
        other = [x[s]["other_cores"] for x in r["rounds"] for s in ("single", "multi") if s in x]
        out.append(
            f"| {r['server']} | {r['adapters']} | {r.get('dtype', '-')} "
            f"| {f(r['tokens_per_s'], 1)} | {f(r['single_tokens_per_s'], 1)} "
            f"| {f(r['ratio_median'])}x ({f(r['ratio_first'])} / {f(r['ratio_steady'])}) "
            f"[{f(rng[0])}-{f(rng[1])}] | {f(r.get('ratio_matched_median'))}x / "
            f"{f(r.get('ratio_r16_median'))}x ({f(r.get('mean_rank'), 1)}) "
            f"| {f(r.get('cpu_ratio_median'))}x "
            f"| {f(r['ttft_resident_p50'])}/{f(r['ttft_resident_p95'])} "
            f"| {f(r['ttft_cold_p50'])}/{f(r['ttft_cold_p95'])} ({r['n_cold']}) "
            f"| {f(r.get('loads'), 0)} ({f(r.get('load_s'))}) / {f(r.get('evictions'), 0)} "
            f"| {f(r.get('file_mib'), 1)} ({f(r.get('page_cached'))}) "
            f"| {f(res / 2**20 if res else None, 0)} ({f(r.get('resident'), 0)}/"
            f"{r.get('budget', '-')}) | {f(r['peak_rss_mib'], 0)} {_bound(r)} "
            f"| {r['finished']}/{r['requests']} | {f(max(other) if other else None, 1)} |"
        )
    return "\n".join(out)


def _bound(r: dict[str, Any]) -> str:
    """``(warm + KV + budget + in flight = bound)`` for a loraserve row, else nothing."""
    if r.get("rss_bound_mib") is None:
        return ""
    parts = [r[k] for k in ("rss_warm_mib", "kv_max_mib", "adapter_budget_mib",
                            "adapter_in_flight_mib", "rss_bound_mib")]  # fmt: skip
    return "({:.0f} + {:.0f} + {:.0f} + {:.0f} = {:.0f})".format(*parts)
