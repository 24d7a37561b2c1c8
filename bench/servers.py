"""Launching the two servers, one at a time, on 127.0.0.1, and watching the machine.

`launch` starts a server process, waits for a healthy `/health` (that wait is S7's start-up
time) and stops it on exit; the runner never holds two of these at once. `CpuMeter` measures
how many CPU cores other processes kept busy meanwhile, from `/proc`.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ServerKind:
    """How to start one of the servers: `name` is `loraserve` or `llama-server`; `extra`
    flags go after the common command line."""

    name: str
    argv0: tuple[str, ...]
    extra: tuple[str, ...] = ()


def loraserve_kind(extra: Sequence[str] = ()) -> ServerKind:
    """loraserve, run by this Python interpreter."""
    return ServerKind("loraserve", (sys.executable, "-m", "loraserve.cli"), tuple(extra))


def peer_kind(binary: Path, extra: Sequence[str] = ()) -> ServerKind:
    """llama.cpp's llama-server at `binary`."""
    return ServerKind("llama-server", (str(binary),), tuple(extra))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_argv(
    kind: ServerKind,
    model: Path,
    port: int,
    *,
    threads: int,
    parallel: int,
    ctx: int,
    cache_ram: int,
    adapters: Sequence[Path] = (),
) -> list[str]:
    """The same llama-server command line for both servers (only argv[0] differs)."""
    argv = [*kind.argv0, "-m", str(model), "-t", str(threads), "--host", HOST, "--port", str(port)]
    argv += ["-np", str(parallel), "-c", str(ctx), "--cache-ram", str(cache_ram)]
    for path in adapters:
        argv += ["--lora", str(path)]
    if adapters:
        argv.append("--lora-init-without-apply")
    return argv + list(kind.extra)


@dataclass
class Running:
    """A started, healthy server."""

    kind: str
    url: str
    proc: subprocess.Popen[bytes]
    startup_s: float
    log_path: Path

    def peak_rss_mib(self) -> float | None:
        """The process's peak resident memory (VmHWM) in MiB, if it can be read."""
        try:
            text = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return None


class LaunchError(RuntimeError):
    """The server exited or never became healthy; carries the end of its log."""


def _log_tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def launch(
    kind: str,
    argv: list[str],
    port: int,
    timeout: float = 180.0,
    *,
    env: Mapping[str, str | None] | None = None,
    on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Iterator[Running]:
    """Start `argv`, wait until `/health` answers 200, yield, then stop the process.

    `env` overrides this process's environment (None removes a variable); `on_spawn` is
    called with the process right after it starts (before the wait for health)."""
    log = Path(tempfile.mkstemp(prefix=f"bench-{kind}-", suffix=".log")[1])
    url = f"http://{HOST}:{port}"
    t0 = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=_env(env))
    try:
        if on_spawn is not None:
            on_spawn(proc)
        with httpx.Client(timeout=2.0) as client:
            while True:
                if proc.poll() is not None:
                    raise LaunchError(f"{kind} exited ({proc.returncode}):\n{_log_tail(log)}")
                if time.perf_counter() - t0 > timeout:
                    raise LaunchError(f"{kind} not healthy after {timeout:.0f} s")
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        yield Running(kind, url, proc, time.perf_counter() - t0, log)
    finally:
        _stop(proc)


def _env(overrides: Mapping[str, str | None] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for key, value in (overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _busy_jiffies() -> int:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return user + nice + system + irq + softirq + steal


def _proc_jiffies(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class CpuMeter:
    """CPU cores kept busy by processes other than this one and the server under test."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self.t0 = time.monotonic()
        self.busy0 = _busy_jiffies()
        self.ours0 = self._ours()

    def _ours(self) -> int:
        t = os.times()
        own = int((t.user + t.system) * CLK_TCK)
        return own + (_proc_jiffies(self.pid) if self.pid else 0)

    def other_cores(self) -> float:
        """Average cores used by everything else since the meter started."""
        elapsed = max(time.monotonic() - self.t0, 1e-3)
        other = (_busy_jiffies() - self.busy0) - (self._ours() - self.ours0)
        return max(other, 0) / CLK_TCK / elapsed


def machine_load() -> dict[str, float]:
    """The load averages and core count, for the results."""
    one, five, fifteen = os.getloadavg()
    return {"load1": one, "load5": five, "load15": fifteen, "nproc": os.cpu_count() or 0}


def machine() -> dict[str, str]:
    """The CPU model, Python and torch versions, for the results."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"cpu": cpu, "python": platform.python_version(), "torch": torch.__version__}


def wait_quiet(limit: float, max_wait: float) -> float:
    """Wait (up to `max_wait` s) for the 1-minute load average to drop below `limit`."""
    t_end = time.monotonic() + max_wait
    while (load := machine_load()["load1"]) >= limit and time.monotonic() < t_end:
        print(f"bench: load1 {load:.2f} >= {limit}, waiting", file=sys.stderr)
        time.sleep(min(30.0, max(t_end - time.monotonic(), 0.1)))
    return load
