"""Router bench (issue 30): ten presets over one base file, loraserve vs llama-server's router.

Both servers start without `-m`, from the same `--models-preset` INI: ten presets over the real
model, each with its own adapter mix (the two demo adapters at different scales) and sampling
defaults, `--models-max 10`, autoload on. One server at a time, never together.

Measured per server:
- **cold first answer**: a request naming the first preset while nothing is loaded, sent once
  the router has been up `IDLE_S` (loraserve starts a spare engine process at start, which a
  first load takes: right after start the answer would also wait for that process), from send
  to the whole answer (16 tokens): it includes loading the model;
- **second preset**: the same for a second preset over the same base, once the first is loaded
  (llama-server starts another process; loraserve's presets share one engine);
- **RSS**: with all ten presets answered once, the resident memory of the server and every
  process it started (`psutil`, recursive), and the sum of their peaks (VmHWM); the router
  process's own RSS apart, and whether it has torch's library mapped (loraserve's must not:
  its engines run in child processes).

- **start**: from spawning the router (no model loaded) to its first `/health` 200, the
  median of `STARTS` starts (`launch` polls every 50 ms: the figures' resolution); loraserve's
  modules are byte-compiled first (`compileall`, checked-hash: a source edited since is read
  from source, never from a stale file), as an installed package's are (this tree's sessions
  set `PYTHONDONTWRITEBYTECODE`: else every start compiles every module from source, ~0.1 s).

Prints the table and the loraserve / llama-server ratios, writes
`bench/results/router_presets_<ts>.json`. `--quick` uses three presets (a pipeline check, not
the bench's figures).

    python -m bench.router_presets [--quick] [--no-peer]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.peer import find_peer
from bench.servers import HOST, free_port, launch, loraserve_kind, peer_kind
from loraserve.adapters import ADAPTERS_DIR

MODEL = Path.home() / ".cache/loraserve/gemma3-270m-q4_k_m.gguf"
RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "The old lighthouse keeper opened the door and"
IDLE_S = 5.0  # after start, before the cold request: on both servers
STARTS = 5  # router starts timed, per server (median)
ROOT = Path(__file__).resolve().parents[1]


def presets_ini(model: Path, n: int) -> str:
    """`n` presets over `model`: preset i mixes the demo adapters at scales (i/n, 1 - i/n)
    and has its own temperature, so no two presets share an adapter mix."""
    lines = ["version = 1", "", "[*]", "c = 2048", "np = 1", "t = 2", "cache-ram = 0", ""]
    up, title = ADAPTERS_DIR / "uppercase.gguf", ADAPTERS_DIR / "titlecase.gguf"
    for i in range(n):
        a, b = round((i + 1) / (n + 1), 3), round(1 - (i + 1) / (n + 1), 3)
        lines += [
            f"[preset-{i}]",
            f"model = {model}",
            f"lora-scaled = {up}:{a},{title}:{b}",
            f"temp = {round(0.1 * i, 2)}",
            "",
        ]
    return "\n".join(lines)


def tree_memory(pid: int) -> dict[str, float]:
    """Resident memory (MiB) of `pid` and all its descendants now, and the sum of their peaks."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    rss = hwm = 0.0
    own = root.memory_info().rss / 2**20
    torch = "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    for p in procs:
        try:
            rss += p.memory_info().rss / 2**20
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm += int(line.split()[1]) / 1024
        except (psutil.Error, OSError):
            continue
    return {
        "rss_mib": round(rss, 1),
        "peak_sum_mib": round(hwm, 1),
        "processes": len(procs),
        "router_rss_mib": round(own, 1),
        "router_has_torch": torch,
    }


def answer(client: httpx.Client, url: str, preset: str) -> float:
    """Seconds from sending a 16-token completion under `preset` to its whole answer."""
    body = {"model": preset, "prompt": PROMPT, "n_predict": 16, "temperature": 0}
    t0 = time.perf_counter()
    # a connection of its own: llama-server's router dropped a kept-alive connection after
    # nine answers (the tenth request got no response), which is the client's cost, not a load
    close = {"Connection": "close"}
    r = client.post(f"{url}/v1/completions", json={**body, "max_tokens": 16}, headers=close)
    if r.status_code != 200:
        raise RuntimeError(f"{preset}: HTTP {r.status_code}: {r.text[:300]}")
    return time.perf_counter() - t0


def start_times(name: str, argv0: tuple[str, ...], ini: Path, n: int) -> list[float]:
    """Seconds from spawn to the first `/health` 200 of `STARTS` routers (stopped at once)."""
    out = []
    for _ in range(STARTS):
        port = free_port()
        argv = [*argv0, "--models-preset", str(ini), "--models-max", str(n)]
        with launch(name, [*argv, "--host", HOST, "--port", str(port)], port) as srv:
            out.append(round(srv.startup_s, 3))
            kids = psutil.Process(srv.proc.pid).children(recursive=True)
        psutil.wait_procs(kids, timeout=30)  # loraserve's spare engine process ends too: the
        # next start must not share the CPU with a process still importing torch
    return out


def run_server(name: str, argv0: tuple[str, ...], ini: Path, n: int) -> dict[str, Any]:
    """One router over the presets: cold first answer, second preset, RSS with all loaded;
    then its start time."""
    port = free_port()
    argv = [*argv0, "--models-preset", str(ini), "--models-max", str(n)]
    argv += ["--host", HOST, "--port", str(port)]
    with launch(name, argv, port, timeout=300) as srv, httpx.Client(timeout=600) as client:
        out: dict[str, Any] = {"startup_s": round(srv.startup_s, 2), "idle_s": IDLE_S}
        time.sleep(IDLE_S)  # a router up a while (loraserve's spare engine process is ready)
        out["cold_first_answer_s"] = round(answer(client, srv.url, "preset-0"), 3)
        out["warm_answer_s"] = round(answer(client, srv.url, "preset-0"), 3)
        out["second_preset_s"] = round(answer(client, srv.url, "preset-1"), 3)
        for i in range(2, n):
            answer(client, srv.url, f"preset-{i}")
        time.sleep(1.0)
        out.update(tree_memory(srv.proc.pid))
        listed = client.get(f"{srv.url}/models").json()["data"]
        out["loaded"] = sum(1 for m in listed if m.get("status", {}).get("value") == "loaded")
    out["starts_s"] = start_times(name, argv0, ini, n)
    out["start_median_s"] = statistics.median(out["starts_s"])
    print(f"{name}: {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="three presets: a pipeline check")
    ap.add_argument("--no-peer", action="store_true", help="skip llama-server")
    ap.add_argument("--model", type=Path, default=MODEL)
    args = ap.parse_args(argv)
    n = 3 if args.quick else 10
    subprocess.run(  # loraserve's bytecode, as an install has it (see the module docstring)
        [sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "checked-hash",
         str(ROOT / "loraserve")],
        check=True,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        ini = Path(tmp) / "presets.ini"
        ini.write_text(presets_ini(args.model, n))
        rows = {"loraserve": run_server("loraserve", loraserve_kind().argv0, ini, n)}
        peer = None if args.no_peer else find_peer()
        if peer is not None:
            rows["llama-server"] = run_server("llama-server", peer_kind(peer).argv0, ini, n)
    result: dict[str, Any] = {"presets": n, "quick": args.quick, "servers": rows}
    if "llama-server" in rows:
        ours, theirs = rows["loraserve"], rows["llama-server"]
        result["ratios"] = {  # loraserve / llama-server: below 1 is less memory / less time
            k: round(ours[k] / theirs[k], 3)
            for k in (
                "rss_mib",
                "peak_sum_mib",
                "cold_first_answer_s",
                "second_preset_s",
                "start_median_s",
            )  # fmt: skip
        }
        print("loraserve / llama-server:", result["ratios"])
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"router_presets_{time.strftime('%Y-%m-%d_%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
