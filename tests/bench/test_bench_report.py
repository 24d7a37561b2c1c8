"""The benchmark's report: the table reads partial results, the plot is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report
from bench.run import _update_readme

LOAD = {"load1": 0.4, "load5": 0.5, "load15": 0.6, "nproc": 2}
MACHINE = {"cpu": "cpu", "python": "3.11", "torch": "2", "nproc": 2}


def results() -> dict:
    sweep = [
        {"clients": 4, "mixes": 0, "agg_tok_s": 80.0},
        {"clients": 4, "mixes": 1, "agg_tok_s": 70.0},
        {"clients": 4, "mixes": 4, "agg_tok_s": 60.0},
    ]
    s6 = {"adapters": 16, "throughput_tok_s": 30.0, "latency_p50_s": 1.0, "latency_p95_s": 2.0}
    check = {"checked": 4, "stale": 0, "differ_without_reuse": 0, "examples": []}
    return {
        "timestamp": "2026-01-01 00:00:00",
        "quick": False,
        "model": "m.gguf",
        "machine": {**MACHINE, "load_before": LOAD, "load_after": LOAD},
        "config": {"threads": 2, "sweep_plan": [(4, 0), (4, 1), (4, 4)]},
        "servers": {
            "loraserve": {
                "load_before": LOAD,
                "load_after": LOAD,
                "other_cores": 0.1,
                "s1": {"prefill_tok_s": 600.0},
                "s2": {"decode_tok_s": 50.0},
                "sweep": sweep,
                "s5": {"explicit": {"prompt_tokens_evaluated": 100, "stale_check": check}},
                "s6": [s6, None],
                "s7": {"startup_s": 2.0},
                "errors": {"s6-64": "TimeoutError: x"},
            },
            "llama-server": {
                "s1": {"prefill_tok_s": 500.0},
                "s2": {"decode_tok_s": 0},
                "sweep": [{"clients": 4, "mixes": 4, "agg_tok_s": 30.0}],
                "s5": {"explicit": {"stale_check": {**check, "stale": 3}}},
            },
        },
    }


def test_markdown_table_ratios_and_gaps() -> None:
    md = report.markdown(results())
    lines = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines()}
    assert lines["S1 prefill tok/s (512-token prompt)"].endswith("| 600 | 500 | 1.2 |")
    assert lines["S4 aggregate tok/s, 4 clients, 4 distinct mixes"].endswith("| 60 | 30 | 2 |")
    assert lines["S2 decode tok/s (1 stream, 200 + 128)"].endswith("| 50 | 0 | - |")
    stale = "S5 explicit: stale answers (differ from cache-off after KV reuse)"
    assert lines[stale].endswith("| 0/4 | 3/4 | - |")
    assert lines["S6 Zipf over 64 adapters: throughput tok/s"].endswith("| - | - | - |")
    assert "s6-64: TimeoutError" in md
    assert "not reliable" not in md


def test_markdown_warns_on_a_busy_machine() -> None:
    r = results()
    r["machine"]["load_before"] = {**LOAD, "load1": 3.0}
    assert "not reliable" in report.markdown(r)


def test_plot_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = report.plot(results(), tmp_path / "p.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"


def test_readme_block_replaced(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- latest results -->\nold\n<!-- end latest results -->\nend\n")
    _update_readme(readme, "new table\n")
    assert readme.read_text() == (
        "intro\n<!-- latest results -->\nnew table\n<!-- end latest results -->\nend\n"
    )
