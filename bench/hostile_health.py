"""`/health` latency under the hostile load of `tests/hardening/test_hostile_load.py`
(issue 31), measured three ways at once so the server's share can be told from the
client's:

- `inloop`: the test's own probe, a task on the storm's event loop (the hostile clients
  encode their 260-520 KB bodies and parse every streamed line on that loop, so a stall
  there is counted as `/health`'s);
- `probe`: a separate process sending `GET /health` on a raw socket every 20 ms (only the
  server's time, the kernel's and the scheduler's);
- `lag`: (in-thread server only) how late a 10 ms sleep on the server's event loop wakes.

    python -m bench.hostile_health --server thread --rounds 2
    python -m bench.hostile_health --server process --rounds 2
    python -m bench.hostile_health --server process --slow-ms 25   # + the loop's slow callbacks
    LORASERVE_BACKGROUND_NICE=0 python -m bench.hostile_health --server process   # niceness off

`--server thread` runs uvicorn in a thread of this process, as the test does (server and
clients share one GIL); `--server process` runs `loraserve` as its own process, as it is
deployed. Prints one line per round with each probe's p50/p99/max in ms. With `--slow-ms`,
the server process runs on asyncio's own loop (not uvloop) with every loop callback that
took longer than that logged to stderr with its wall and CPU time: wall far above CPU means
the loop thread waited (for the GIL, or for a core), not worked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import IO

import httpx

from tests.hardening import hostile_util as hl
from tests.server_util import (
    free_socket,
    peft_folder,
    serve_in_thread,
    start_process,
    tiny_model_path,
)


def stats(xs: list[float]) -> dict[str, float]:
    """p50/p99/max of `xs` (seconds) in ms, and their count."""
    if not xs:
        return {"n": 0}
    s = sorted(xs)
    q = lambda p: round(s[int(p * (len(s) - 1))] * 1000, 1)  # noqa: E731
    return {"p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(s[-1] * 1000, 1), "n": len(s)}


def pct(xs: list[float]) -> str:
    """p50/p99/max of `xs` (seconds) in ms."""
    if not xs:
        return "-"
    st = stats(xs)
    return f"p50 {st['p50_ms']:.0f} p99 {st['p99_ms']:.0f} max {st['max_ms']:.0f} (n={st['n']})"


def raw_probe(port: int, stop: mp.synchronize.Event, out: mp.Queue) -> None:  # type: ignore[name-defined]
    """GET /health on a kept-alive raw socket every 20 ms until `stop`; latencies to `out`."""
    lat: list[float] = []
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    req = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    while not stop.is_set():
        t = time.monotonic()
        sock.sendall(req)
        buf = b""
        while not (b"\r\n\r\n" in buf and buf.endswith(b"}")):
            chunk = sock.recv(4096)
            if not chunk:
                raise RuntimeError("connection closed")
            buf += chunk
        lat.append(time.monotonic() - t)
        time.sleep(0.02)
    out.put(lat)


async def loop_lag(stop: asyncio.Event, lag: list[float]) -> None:
    """How late a 10 ms sleep wakes on the loop it runs on."""
    while not stop.is_set():
        t = time.monotonic()
        await asyncio.sleep(0.01)
        lag.append(time.monotonic() - t - 0.01)


SLOW_LAUNCH = """
import asyncio, sys, time, uvicorn
import loraserve.server.process as app  # serve and its uvicorn
slow = float(sys.argv.pop(1)) / 1000
run = asyncio.events.Handle._run
def timed(self):
    t, c = time.perf_counter(), time.thread_time()
    run(self)
    if time.perf_counter() - t > slow:
        w, u = (time.perf_counter() - t) * 1000, (time.thread_time() - c) * 1000
        print(f"slow callback: wall {w:.0f} ms, cpu {u:.0f} ms: {self._callback!r:.120}",
              file=sys.stderr)
asyncio.events.Handle._run = timed
config = uvicorn.Config
app.uvicorn.Config = lambda *a, **k: config(*a, **{**k, "loop": "asyncio"})
from loraserve.cli import main
main(sys.argv[1:])
"""


def slow_process(args: list[str], slow_ms: float) -> tuple[subprocess.Popen, str]:
    """`start_process`, with the slow-callback log (stderr passed through)."""
    with free_socket() as sock:
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-c", SLOW_LAUNCH, str(slow_ms), "-m", str(tiny_model_path())]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([*cmd, "--port", str(port), "-t", "1", *args], env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not become healthy")


def one_round(url: str, app: object | None, record: list[dict] | None = None) -> str:
    port = int(url.rsplit(":", 1)[1])
    stop, out = mp.Event(), mp.Queue()
    probe = mp.Process(target=raw_probe, args=(port, stop, out), daemon=True)
    probe.start()
    lag: list[float] = []
    lag_task = None
    if app is not None:  # in-thread server: watch its loop
        loop = app.state.server.loop  # type: ignore[attr-defined]
        lag_stop = asyncio.Event()
        lag_task = asyncio.run_coroutine_threadsafe(loop_lag(lag_stop, lag), loop)
    t0 = time.monotonic()
    good, codes, inloop = asyncio.run(hl.storm(url))
    took = time.monotonic() - t0
    stop.set()
    probe_lat = out.get(timeout=30)
    probe.join(5)
    if lag_task is not None:
        loop.call_soon_threadsafe(lag_stop.set)
        lag_task.result(5)
    bad = {c: n for c, n in codes.items() if c >= 500}
    if record is not None:
        row = {"storm_s": round(took, 2), "codes": {str(c): n for c, n in codes.items()}}
        row.update(inloop=stats(inloop), probe=stats(probe_lat), good=len(good))
        row["good_200"] = sum(1 for g in good if g[0] == 200)
        if app is not None:
            row["lag"] = stats(lag)
        record.append(row)
    return (
        f"storm {took:.1f}s 5xx={bad or 0}\n  inloop {pct(inloop)}\n  probe  {pct(probe_lat)}"
        + (f"\n  lag    {pct(lag)}" if app is not None else "")
    )


def _drain(pipe: IO[bytes]) -> None:
    """Read a server's stderr to its end (its log lines are not needed here)."""
    while pipe.read(65536):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=["thread", "process"], default="thread")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--url", help="a server already running with the test's flags")
    ap.add_argument("--slow-ms", type=float, help="process: log loop callbacks over this")
    ap.add_argument("--json", action="store_true", help="write bench/results/hostile_health_*")
    a = ap.parse_args()
    rounds: list[dict] = []
    try:
        _run(a, rounds)
    finally:
        if a.json and rounds:
            write_json(a, rounds)


def write_json(a: argparse.Namespace, rounds: list[dict]) -> None:
    """The rounds, and over all of them the probe's p99 and the 5xx count."""
    out_dir = Path(__file__).resolve().parent / "results"
    path = out_dir / f"hostile_health_{time.strftime('%Y-%m-%d_%H%M%S')}.json"
    p99 = [r["probe"].get("p99_ms", 0.0) for r in rounds]
    n5xx = sum(n for r in rounds for c, n in r["codes"].items() if int(c) >= 500)
    summary = {"rounds": len(rounds), "probe_p99_ms_max": max(p99), "5xx": n5xx}
    body = {"server": a.server, "summary": summary, "rounds": rounds}
    path.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {path}: {summary}", flush=True)


def _run(a: argparse.Namespace, rounds: list[dict]) -> None:
    if a.url:
        for i in range(a.rounds):
            print(f"[{a.url} round {i}] {one_round(a.url, None, rounds)}", flush=True)
        return
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        peft_folder(tmp / "loras" / "a", 1)
        (tmp / "slots").mkdir()
        args = ["-np", "4", "-c", "1024", "--reranking", "--slot-save-path", str(tmp / "slots")]
        args += ["--lora-dir", str(tmp / "loras")]
        if a.server == "thread":
            srv = stack.enter_context(serve_in_thread(args))
            url, app = srv.url, srv.app
        else:
            proc, url = slow_process(args, a.slow_ms) if a.slow_ms else start_process(args)
            if proc.stderr is not None:  # drained: a full pipe blocks the server's logging,
                # and its loop with it (two runs froze at the 7th round, 09:03 and 09:14)
                threading.Thread(target=_drain, args=(proc.stderr,), daemon=True).start()
            stack.callback(proc.wait, 15)
            stack.callback(proc.terminate)
            app = None
        for i in range(a.rounds):
            print(f"[{a.server} round {i}] {one_round(url, app, rounds)}", flush=True)


if __name__ == "__main__":
    main()
