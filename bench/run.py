"""The benchmark runner: `python -m bench.run [--quick] [--s8 | --s8-only]`.

Runs scenarios S1-S7 (issue 5) against loraserve and then llama-server, never both at once,
on 127.0.0.1, with the same GGUF, the same adapters and the same thread count, and writes
`bench/results/<timestamp>.json`, `latest.md` (the table) and `latest.png` (the plot).
S8 (scaling with model size, `bench/scaling.py`) runs after them with `--s8`, or alone with
`--s8-only`, whose rows are then merged into the run behind the current `latest.md`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench import report
from bench.chat import MODES, s5_chat
from bench.peer import obtain_peer
from bench.scaling import S8Plan, base_results, merge, parse_models, run_s8
from bench.scenarios import Target, guarded, s1_prefill, s2_decode, s6_zipf, s34_sweep, warm_up
from bench.servers import (
    CpuMeter,
    LaunchError,
    ServerKind,
    free_port,
    launch,
    loraserve_kind,
    machine,
    machine_load,
    peer_kind,
    server_argv,
    wait_quiet,
)
from bench.workloads import write_adapters

RESULTS = Path(__file__).parent / "results"
FULL_SWEEP = [(4, 0), (4, 1), (4, 4), (8, 0), (8, 1), (8, 2), (8, 4), (8, 8)]


@dataclass
class Plan:
    """Sizes and caps of one run; `quick()` is the short debugging variant."""

    threads: int = 2
    n_adapters: int = 64
    sweep_plan: list[tuple[int, int]] = field(default_factory=lambda: list(FULL_SWEEP))
    s1_reps: int = 3
    s2: dict[str, int] = field(default_factory=lambda: {"n_predict": 128, "reps": 2})
    agg_predict: int = 48
    s5: dict[str, Any] = field(default_factory=dict)
    s6_adapters: tuple[int, ...] = (16, 64)
    s6: dict[str, Any] = field(default_factory=dict)
    s7_reps: int = 2

    @staticmethod
    def quick() -> Plan:
        return Plan(
            n_adapters=16,
            sweep_plan=[(4, 0), (4, 1), (4, 4)],
            s1_reps=1,
            s2={"n_predict": 32, "reps": 1},
            agg_predict=12,
            s5={"users": 2, "turns": 2, "n_predict": 8, "system_tokens": 96, "cap": 60},
            s6_adapters=(16,),
            s6={"n_requests": 6, "rate": 2.0, "n_predict": 8, "cap": 30},
            s7_reps=1,
        )


@dataclass(frozen=True)
class Setup:
    """What both servers share in one run."""

    model: Path
    adapters: list[Path]
    encode: Any
    bos: tuple[int, ...]
    eog: frozenset[int]
    plan: Plan


def _argv(kind: ServerKind, setup: Setup, port: int, **kw: Any) -> list[str]:
    return server_argv(kind, setup.model, port, threads=setup.plan.threads, **kw)


def _main_scenarios(t: Target, plan: Plan, out: dict[str, Any]) -> None:
    errors = out["errors"]
    guarded("warm-up", lambda: warm_up(t), errors)
    out["s1"] = guarded("s1", lambda: s1_prefill(t, reps=plan.s1_reps), errors)
    out["s2"] = guarded("s2", lambda: s2_decode(t, **plan.s2), errors)
    sweep = [p for p in plan.sweep_plan if t.n_adapters or p[1] == 0]
    out["sweep"] = guarded("s3/s4", lambda: s34_sweep(t, sweep, plan.agg_predict), errors)
    if t.n_adapters:
        out["s6"] = [
            guarded(f"s6-{n}", lambda n=n: s6_zipf(t, n, **plan.s6), errors)
            for n in plan.s6_adapters
        ]


def _main_phase(kind: ServerKind, setup: Setup, deadline: float, out: dict[str, Any]) -> None:
    """S1-S4 and S6 on an 8-slot instance with every adapter loaded; if that instance does
    not start, the scenarios that need no adapter on one without them."""
    for adapters in (setup.adapters, []):
        port = free_port()
        argv = _argv(kind, setup, port, parallel=8, ctx=8192, cache_ram=2048, adapters=adapters)
        try:
            with launch(kind.name, argv, port) as srv:
                meter = CpuMeter(srv.proc.pid)
                if adapters:
                    out["s7"]["with_adapters_s"] = srv.startup_s
                target = Target(srv.url, len(adapters), setup.encode, setup.bos, deadline)
                _main_scenarios(target, setup.plan, out)
                out["peak_rss_mib"] = srv.peak_rss_mib()
                out["other_cores"] = meter.other_cores()
            return
        except LaunchError as e:
            out["errors"]["main" if adapters else "main-without-adapters"] = str(e)
            if adapters:
                out["errors"]["s3/s4/s6"] = "adapter points skipped: no start with adapters"


def _chat_phase(kind: ServerKind, setup: Setup, deadline: float, out: dict[str, Any]) -> None:
    port = free_port()
    adapters = setup.adapters[:4]
    argv = _argv(kind, setup, port, parallel=2, ctx=4096, cache_ram=2048, adapters=adapters)
    try:
        with launch(kind.name, argv, port) as srv:
            meter = CpuMeter(srv.proc.pid)
            t = Target(srv.url, len(adapters), setup.encode, setup.bos, deadline)
            out["s5"] = {
                mode: guarded(
                    f"s5-{mode}", lambda mode=mode: s5_chat(t, mode, setup.eog, **setup.plan.s5),
                    out["errors"],
                )
                for mode in MODES
            }  # fmt: skip
            out["s5"]["other_cores"] = meter.other_cores()
    except LaunchError as e:
        out["errors"]["s5"] = str(e)


def bench_server(kind: ServerKind, setup: Setup, deadline: float) -> dict[str, Any]:
    """All scenarios against one server: S7 first (bare starts), then S1-S4 and S6 on one
    instance with every adapter loaded, then S5 on a two-slot instance."""
    out: dict[str, Any] = {"load_before": machine_load(), "errors": {}, "s7": {}}
    print(f"bench: {kind.name}, load1 {out['load_before']['load1']:.2f}", file=sys.stderr)
    starts = []
    for _ in range(setup.plan.s7_reps):
        port = free_port()
        try:
            argv = _argv(kind, setup, port, parallel=1, ctx=2048, cache_ram=0)
            with launch(kind.name, argv, port) as srv:
                starts.append(srv.startup_s)
        except LaunchError as e:
            out["errors"]["s7"] = str(e)
    out["s7"]["startup_s"] = min(starts) if starts else None
    out["s7"]["runs"] = starts
    now = time.monotonic()
    _main_phase(kind, setup, now + (deadline - now) * 0.7, out)
    _chat_phase(kind, setup, deadline, out)
    out["load_after"] = machine_load()
    return out


def _setup(model: Path, plan: Plan) -> Setup:
    from loraserve.model.default import cache_dir
    from loraserve.model.gguf import GGUFFile
    from loraserve.model.tokenizer import Tokenizer

    with GGUFFile(model) as g:
        tok = Tokenizer.from_gguf_metadata(g.metadata)
    adapters = write_adapters(cache_dir() / "bench-adapters", plan.n_adapters)
    return Setup(
        model=model,
        adapters=adapters,
        encode=lambda text: tok.encode(text, add_special=False, parse_special=True),
        bos=(tok.bos_id,) if tok.bos_id is not None else (),
        eog=frozenset(tok.eog_ids),
        plan=plan,
    )


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, run the benchmark and write the results."""
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="tiny caps, for checking the harness")
    ap.add_argument("--budget", type=float, default=840.0, help="seconds for the whole run")
    ap.add_argument("--servers", default="loraserve,llama-server", help="which, in order")
    ap.add_argument("--model", type=Path, help="GGUF (default: loraserve's default model)")
    ap.add_argument("--build-peer", action="store_true", help="build llama-server if missing")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="first wait up to S seconds for load1 < 1.0")  # fmt: skip
    ap.add_argument(
        "--loraserve-args", default="", help="extra loraserve flags, e.g. '--dtype float32'"
    )
    ap.add_argument("--peer-args", default="", help="extra llama-server flags")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--s8", action="store_true", help="also run S8 (model sizes) at the end")
    ap.add_argument("--s8-only", action="store_true", help="only S8, merged into latest.md")
    ap.add_argument("--s8-models", type=parse_models, default=S8Plan().models, metavar="LIST",
                    help="S8 models, e.g. 270m,1b (default: 270m,1b,4b)")  # fmt: skip
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.budget
    if args.wait_quiet:
        wait_quiet(1.0, args.wait_quiet)
        deadline = time.monotonic() + args.budget
    if args.model is None:
        from loraserve.model.default import default_model_path

        args.model = default_model_path()
    plan = Plan.quick() if args.quick else Plan()
    if args.s8_only:
        plan.n_adapters, plan.sweep_plan = 0, []
    setup = _setup(args.model, plan)
    results: dict[str, Any] = {
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "quick": args.quick,
        "model": args.model.name,
        "machine": {**machine(), "nproc": machine_load()["nproc"], "load_before": machine_load()},
        "config": {
            "threads": plan.threads,
            "adapters": plan.n_adapters,
            "rank": 8,
            "sweep_plan": plan.sweep_plan,
            "budget_s": args.budget,
        },  # fmt: skip
        "servers": {},
    }
    kinds = []
    for name in args.servers.split(","):
        if name == "loraserve":
            from loraserve import cbuild

            cbuild.build_into_package()  # the install step (README): S8's starts find them
            kinds.append(loraserve_kind(shlex.split(args.loraserve_args)))
        elif name == "llama-server":
            binary = obtain_peer(build=args.build_peer)
            if binary is None:
                results["peer_missing"] = "llama-server not found or not buildable: skipped"
            else:
                kinds.append(peer_kind(binary, shlex.split(args.peer_args)))
                results["peer_binary"] = str(binary)
    for i, kind in enumerate(kinds if not args.s8_only else []):
        now = time.monotonic()
        share = now + (deadline - now) / (len(kinds) - i)
        results["servers"][kind.name] = bench_server(kind, setup, share)
    results["machine"]["load_after"] = machine_load()
    results["wall_s"] = time.monotonic() - t0
    if args.s8 or args.s8_only:
        s8_plan = S8Plan(models=args.s8_models, threads=plan.threads)
        if args.quick:
            s8_plan = replace(s8_plan, prefill_reps=1, n_predict=16, cap=60.0)
        s8 = run_s8(kinds, s8_plan, setup.encode, setup.bos)
        base = base_results(args.out) if args.s8_only else None
        if base is not None:
            base["s1_s7_timestamp"] = base.get("s1_s7_timestamp", base["timestamp"])
            base["timestamp"] = s8["meta"]["timestamp"]
        else:
            results["s8_only"] = args.s8_only
        results = merge(base or results, s8)
    write(results, args.out)


def write(results: dict[str, Any], out: Path) -> None:
    """`<stamp>.json`, `latest.md` with `latest.png`, and the README's latest-results block."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = results["timestamp"].replace(" ", "_").replace(":", "")
    stamp += "-quick" if results["quick"] else ""
    (out / f"{stamp}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    table = report.markdown(results)
    png = report.plot(results, out / "latest.png")
    plot = "\n![plot]({}latest.png)\n" if png else ""
    (out / "latest.md").write_text(f"{table}\nRaw results: `{stamp}.json`.\n{plot.format('')}")
    print(table)
    if out.resolve() == RESULTS.resolve():
        block = table.replace("# Benchmark", "### Benchmark", 1)
        block += f"\nRaw results: `results/{stamp}.json`.\n{plot.format('results/')}"
        _update_readme(Path(__file__).parent / "README.md", block)


def _update_readme(readme: Path, block: str) -> None:
    begin, end = "<!-- latest results -->\n", "<!-- end latest results -->"
    text = readme.read_text()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        readme.write_text(head + begin + block + rest[rest.index(end) :])


if __name__ == "__main__":
    main()
