"""Turning a results dict into the markdown table and the throughput plot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

LS, PEER = "loraserve", "llama-server"
Getter = Callable[[dict[str, Any]], Any]


def _sweep(clients: int, mixes: int) -> Getter:
    def get(s: dict[str, Any]) -> Any:
        for p in s.get("sweep") or []:
            if p["clients"] == clients and p["mixes"] == mixes:
                return p["agg_tok_s"]
        return None

    return get


def _path(*keys: Any) -> Getter:
    def get(s: dict[str, Any]) -> Any:
        for k in keys:
            if isinstance(s, dict):
                s = s.get(k)
            elif isinstance(s, list) and isinstance(k, int) and k < len(s):
                s = s[k]
            else:
                return None
        return s

    return get


def _s6(n: int, key: str) -> Getter:
    def get(s: dict[str, Any]) -> Any:
        for r in s.get("s6") or []:
            if r and r.get("adapters") == n:
                return r[key]
        return None

    return get


def _stale(mode: str) -> Getter:
    def get(s: dict[str, Any]) -> Any:
        check = _path("s5", mode, "stale_check")(s)
        return None if check is None else f"{check['stale']}/{check['checked']}"

    return get


def rows(sweep_plan: list[tuple[int, int]]) -> list[tuple[str, Getter]]:
    """(metric, getter) for every line of the table, in order."""
    out: list[tuple[str, Getter]] = [
        ("S1 prefill tok/s (512-token prompt)", _path("s1", "prefill_tok_s")),
        ("S2 decode tok/s (1 stream, 200 + 128)", _path("s2", "decode_tok_s")),
    ]
    for clients, mixes in sweep_plan:
        what = {0: "no adapter", 1: "1 shared mix"}.get(mixes, f"{mixes} distinct mixes")
        tag = "S3" if mixes == 1 else "S4" if mixes == clients else "  "
        metric = f"{tag} aggregate tok/s, {clients} clients, {what}".strip()
        out.append((metric, _sweep(clients, mixes)))
    for mode in ("explicit", "global"):
        out += [
            (f"S5 {mode}: prompt tokens evaluated (lower better)",
             _path("s5", mode, "prompt_tokens_evaluated")),
            (f"S5 {mode}: TTFT p50 s (lower better)", _path("s5", mode, "ttft_p50_s")),
            (f"S5 {mode}: TTFT p95 s (lower better)", _path("s5", mode, "ttft_p95_s")),
            (f"S5 {mode}: stale answers (differ from cache-off after KV reuse)", _stale(mode)),
        ]  # fmt: skip
    for n in (16, 64):
        out += [
            (f"S6 Zipf over {n} adapters: throughput tok/s", _s6(n, "throughput_tok_s")),
            (f"S6 Zipf over {n}: latency p50 s (lower better)", _s6(n, "latency_p50_s")),
            (f"S6 Zipf over {n}: latency p95 s (lower better)", _s6(n, "latency_p95_s")),
        ]
    out += [
        ("S7 start-up s, no adapters (lower better)", _path("s7", "startup_s")),
        ("S7 start-up s, with the bench adapters (lower better)", _path("s7", "with_adapters_s")),
        ("peak RSS MiB, main instance (lower better)", _path("peak_rss_mib")),
    ]
    return out


def s8_rows(models: dict[str, dict[str, Any]]) -> list[tuple[str, Getter]]:
    """(metric, getter) for S8's lines: five per model in `models` (name -> {"label": ...})."""
    out: list[tuple[str, Getter]] = []
    for name, info in models.items():
        tag = f"S8 {info.get('label', name)}"
        out += [
            (f"{tag} peak RSS MiB (lower better)", _path("s8", name, "peak_rss_mib")),
            (f"{tag} cold start s, empty caches (lower better)",
             _path("s8", name, "cold_start_s")),
            (f"{tag} warm start s (lower better)", _path("s8", name, "warm_start_s")),
            (f"{tag} prefill tok/s (512-token prompt)", _path("s8", name, "prefill_tok_s")),
            (f"{tag} decode tok/s (1 stream, 64 tokens)", _path("s8", name, "decode_tok_s")),
        ]  # fmt: skip
    return out


def _s8_lines(results: dict[str, Any]) -> list[str]:
    s8 = results["s8"]
    files = ", ".join(
        f"{m['label']} `{m['file']}` ({m['file_mib']:.0f} MiB)" for m in s8["models"].values()
    )
    busy = [f"{s8['models'].get(m, {}).get('label', m)} on {name}: {r['other_cores']:.2f} cores"
            for name, s in results["servers"].items() for m, r in (s.get("s8") or {}).items()
            if (r.get("other_cores") or 0.0) > 0.3]  # fmt: skip
    lines = [
        "",
        f"S8 ({s8['timestamp']}, load1 {s8['load_before']['load1']:.2f} before, "
        f"{s8['load_after']['load1']:.2f} after): one slot, `-c 2048`, "
        f"{s8['plan']['threads']} threads; models {files or 'none'}; 1B and 4B have random "
        "weights of the real shapes (`bench/synth.py`).",
    ]
    if busy:
        lines += ["", "**Other processes kept cores busy during S8 "
                  f"({', '.join(busy)}): those figures are not reliable.**"]  # fmt: skip
    return lines


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def markdown(results: dict[str, Any]) -> str:
    """The results as a markdown page: machine, load, the table, errors."""
    servers = results["servers"]
    ls, peer = servers.get(LS, {}), servers.get(PEER, {})
    m = results["machine"]
    s8 = results.get("s8")
    what = (
        "S8 only."
        if results.get("s8_only")
        else f"Model `{results['model']}`, {results['config']['threads']} threads for both "
        "servers, rank-8 adapters on all seven projections."
    )
    lines = [
        f"# Benchmark {results['timestamp']}{' (quick caps)' if results['quick'] else ''}",
        "",
        f"Machine: {m['cpu']}, {m['nproc']} cores, torch {m['torch']}, Python {m['python']}. "
        + what,
        "",
        f"Load average (1/5/15 min) before: {_load(m['load_before'])}; "
        f"after: {_load(m['load_after'])}.",
    ]
    for name, s in servers.items():
        if "load_before" in s:
            lines.append(
                f"- {name}: load1 {s['load_before']['load1']:.2f} before, "
                f"{s['load_after']['load1']:.2f} after; other processes kept "
                f"{s.get('other_cores', 0):.2f} cores busy on average while it ran."
            )
    if results.get("s1_s7_timestamp"):
        lines += ["", f"S1-S7 and the load above are from the run of {results['s1_s7_timestamp']}."]
    if m["load_before"]["load1"] > 1.0 and not results.get("s8_only"):
        lines += ["", "**The machine was busy (load1 > 1.0): these figures are not reliable.**"]
    lines += _s8_lines(results) if s8 else []
    lines += ["", f"| metric | {LS} | {PEER} | ratio |", "|---|---|---|---|"]
    table = [] if results.get("s8_only") else rows(results["config"]["sweep_plan"])
    for metric, get in table + s8_rows(s8["models"] if s8 else {}):
        a, b = get(ls), get(peer)
        ratio = a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None
        lines.append(f"| {metric} | {_fmt(a)} | {_fmt(b)} | {_fmt(ratio)} |")
    lines += ["", "Ratio = loraserve / llama-server."]
    errors = {n: s.get("errors") for n, s in servers.items() if s.get("errors")}
    if results.get("peer_missing"):
        errors[PEER] = {"peer": results["peer_missing"]}
    if errors:
        lines += ["", "## Errors and skipped scenarios", ""]
        for name, errs in errors.items():
            for k, v in errs.items():
                lines.append(f"- {name} {k}: {v}".replace("\n", " "))
    return "\n".join(lines) + "\n"


def _load(d: dict[str, float]) -> str:
    return f"{d['load1']:.2f} / {d['load5']:.2f} / {d['load15']:.2f}"


def plot(results: dict[str, Any], path: Path) -> Path | None:
    """Aggregate tok/s against the number of distinct adapter mixes, both servers (None when
    there is no such data or no matplotlib)."""
    if not any(s.get("sweep") for s in results["servers"].values()):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {LS: "-o", PEER: "--s"}
    ticks: set[int] = set()
    for name, s in results["servers"].items():
        by_clients: dict[int, list[tuple[int, float]]] = {}
        for p in s.get("sweep") or []:
            if p.get("agg_tok_s"):
                by_clients.setdefault(p["clients"], []).append((p["mixes"], p["agg_tok_s"]))
        for clients, pts in sorted(by_clients.items()):
            pts.sort()
            ticks.update(x for x, _ in pts)
            label = f"{name}, {clients} clients"
            mixed = [p for p in pts if p[0] > 0]
            color = None
            if mixed:
                (line,) = ax.plot(*zip(*mixed, strict=True), styles.get(name, "-"), label=label)
                color = line.get_color()
            for _, y in (p for p in pts if p[0] == 0):
                ax.plot([0], [y], "x", color=color, ms=9, label=None if mixed else label)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xticks(sorted(ticks), [("none" if t == 0 else str(t)) for t in sorted(ticks)])
    ax.set_xlabel("distinct adapter mixes in flight (x at none: no adapter at all)")
    ax.set_ylabel("aggregate decode tok/s")
    load = results["machine"]["load_before"]["load1"]
    ax.set_title(f"Gemma 3 270M, 2 threads, {results['timestamp']} (load1 {load:.2f})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
