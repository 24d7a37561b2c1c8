"""Run llama.cpp's own server test suite (`tools/server/tests`) against llama-server and
loraserve, on the same local model, and write the pass/fail comparison.

    python scripts/llama_suite.py [--targets llama,loraserve] [--model GGUF] [--work DIR]
                                  [--only unit/test_embedding.py ...] [-k EXPR]

The suite comes from the llama-cpp-python sdist the benchmark already uses (`bench.peer`; its
`vendor/llama.cpp`), copied into ``WORK/llama.cpp`` (WORK: ``~/.cache/loraserve/llama-suite``)
with the tree's layout kept (the suite reads ``../../../models/templates`` and
``../../../tools/mtmd`` relative to itself). Its downloads are mapped to local files: every
model (`--hf-repo`, `--hf-file`, `--model-url`) to ``--model`` (default: Gemma 3 270M,
loraserve's default model), the LoRA files of `test_lora` to the demo adapters, the draft
model to the model itself (`tmp/` holds them, where the suite's `download_file` looks
first); a stub `wget` module makes sure nothing else is fetched. The router tests' downloads
(a model, a preset repository) come from a local stand-in hub (`llama_suite_hub`) that both
servers download from. Each target runs with one
worker, one server at a time (`-m "not slow"` unless ``--slow``), through a wrapper
(``LLAMA_SERVER_BIN_PATH``) that rewrites those flags and records how every server process
ended, so a crash (a signal) or a hang (a test over ``--hang-s`` seconds) is counted.
Results: ``WORK/junit-TARGET.xml``, ``WORK/exits-TARGET.jsonl``, ``WORK/report.md`` and
``WORK/report.json`` (per test: the outcome on each target, and its group).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llama_suite_hub import hub_repos, serve  # noqa: E402
from llama_suite_tree import prepare  # noqa: E402

from bench.peer import cache_dir, find_peer  # noqa: E402

# Groups the issue leaves out of the parity target (checked in this order on the test id,
# `unit.test_file::test_name[params]`: a whole file by its module name).
EXCLUDED = {
    "tools/MCP": (
        "test_tools_builtin",
        "test_mcp_servers",
        "test_proxy",
        "cors_proxy",
        "mcp",
        "with_tools",
    ),
    "chat templates": ("test_template::", "template"),
    "router mode": ("test_router::", "router", "models_max", "autoload"),
    "draft speculation": ("test_speculative::", "draft"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_target(target: str, tests: Path, work: Path, model: Path, args: argparse.Namespace):
    """Run the suite once against ``target``; the junit file."""
    junit, exits = work / f"junit-{target}.xml", work / f"exits-{target}.jsonl"
    exits.unlink(missing_ok=True)
    llama = find_peer()
    if target == "llama" and llama is None:
        sys.exit("no llama-server binary: run `python -m bench.peer` first")
    hub, hub_url = serve(hub_repos(model))  # the router tests' downloads (llama_suite_hub)
    env = {
        **os.environ,
        "MODEL_ENDPOINT": hub_url,
        "SUITE_HUB_REPOS": ",".join(hub_repos(model)),
        "LLAMA_SERVER_BIN_PATH": str(work / "server-wrapper"),
        "SUITE_TARGET": target,
        "SUITE_MODEL": str(model),
        "SUITE_LLAMA_BIN": str(llama or ""),
        "SUITE_EXITS": str(exits),
        "PORT": str(free_port()),
        "LLAMA_CACHE": str(tests / "tmp"),  # the suite's default (relative), made absolute
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        # the tools tests read and write the tree and /tmp by absolute path: loraserve's
        # tools refuse paths outside --tools-root (default: the working directory)
        "LORASERVE_TOOLS_ROOT": "/",
    }
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        "-q",
        "-o",
        "junit_duration_report=call",
        *args.only,
    ]
    if not args.slow:
        cmd += ["-m", "not slow"]
    if args.k:
        cmd += ["-k", args.k]
    print(f"== {target}: {' '.join(cmd)}", flush=True)
    try:
        with open(work / f"log-{target}.txt", "w") as log:
            subprocess.run(cmd, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        hub.shutdown()
    return junit


def outcomes(junit: Path) -> dict[str, tuple[str, float]]:
    """Test id -> (pass | fail | skip, seconds) from a junit file."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        state = "fail" if kinds & {"failure", "error"} else "skip" if "skipped" in kinds else "pass"
        out[name] = (state, float(case.get("time") or 0))
    return out


def group(test: str) -> str:
    for name, needles in EXCLUDED.items():
        if any(n in test for n in needles):
            return name
    return "in scope"


def crashes(exits: Path) -> list[dict]:
    """Server processes that ended by a signal the suite did not send (SIGSEGV, SIGABRT...)."""
    if not exits.exists():
        return []
    rows = [json.loads(line) for line in exits.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["rc"] < 0 and not r["stopped"]]


def report(work: Path, targets: list[str], hang_s: float) -> None:
    results = {t: outcomes(work / f"junit-{t}.xml") for t in targets}
    tests = sorted(set().union(*results.values()))
    rows = {t: {k: results[k].get(t, ("absent", 0.0))[0] for k in targets} for t in tests}
    lines = ["# llama.cpp server suite: llama-server vs loraserve", ""]
    for t in targets:
        c = Counter(v[0] for v in results[t].values())
        hangs = [k for k, (_, s) in results[t].items() if s > hang_s]
        lines.append(
            f"- {t}: {c['pass']} pass, {c['fail']} fail, {c['skip']} skip; "
            f"crashes {len(crashes(work / f'exits-{t}.jsonl'))}; tests over "
            f"{hang_s:g} s: {len(hangs)}"
        )
    if set(targets) == {"llama", "loraserve"}:
        both = Counter((r["llama"], r["loraserve"]) for r in rows.values())
        lines += [
            "",
            f"- pass on both {both['pass', 'pass']}, llama-server only "
            f"{both['pass', 'fail']}, loraserve only {both['fail', 'pass']}, "
            f"fail on both {both['fail', 'fail']}",
            "",
        ]
        lines += ["| group | pass on llama-server | of them pass on loraserve |", "|---|---|---|"]
        per: dict[str, list[int]] = {}
        for test, r in rows.items():
            if r["llama"] == "pass":
                g = per.setdefault(group(test), [0, 0])
                g[0] += 1
                g[1] += r["loraserve"] == "pass"
        for g, (n, k) in sorted(per.items()):
            lines.append(f"| {g} | {n} | {k} ({100 * k / max(n, 1):.0f}%) |")
        lines += ["", "## pass on llama-server, fail on loraserve (in scope)", ""]
        lines += [
            f"- `{t}`"
            for t, r in rows.items()
            if r == {"llama": "pass", "loraserve": "fail"} and group(t) == "in scope"
        ]
    text = "\n".join(lines) + "\n"
    (work / "report.md").write_text(text)
    (work / "report.json").write_text(
        json.dumps({t: {**r, "group": group(t)} for t, r in rows.items()}, indent=1)
    )
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--targets", default="llama,loraserve")
    ap.add_argument("--model", help="GGUF every test model maps to (default: Gemma 3 270M)")
    ap.add_argument("--work", default=str(cache_dir().parent / "llama-suite"))
    ap.add_argument("--only", nargs="*", default=[], help="test files or ids, relative to tests/")
    ap.add_argument("-k", help="pytest -k expression")
    ap.add_argument("--slow", action="store_true", help="include the tests marked slow")
    ap.add_argument("--hang-s", type=float, default=120.0)
    ap.add_argument("--start-s", type=int, default=0, help="server start timeout (default 60)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from WORK")
    args = ap.parse_args()
    from loraserve.model.default import resolve_model_path

    model = Path(args.model or resolve_model_path(None)).resolve()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    targets = [t for t in args.targets.split(",") if t]
    if not args.report_only:
        tests = prepare(work, model, args.start_s)
        for target in targets:  # one after the other: one server at a time
            run_target(target, tests, work, model, args)
    report(work, targets, args.hang_s)


if __name__ == "__main__":
    main()
