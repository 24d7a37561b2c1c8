"""A server's memory sampled while a bench runs: `RssSampler` reads `/proc/PID/status`
every `interval` seconds on a thread of the bench (nothing asked of the server, so the
sampling costs it no CPU) and keeps each field's maximum and a short timeline.

VmHWM alone says how high the process went, not with what; the samples split it into
anonymous memory (model tensors, KV, adapter weights, Python) and file pages mapped
(the model's GGUF mapping, adapter files being read), and the timeline shows when it
rose (start-up, a KV pool growth, a burst of adapter reads).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def status_mib(pid: int) -> dict[str, float]:
    """The `FIELDS` of /proc/PID/status in MiB (empty once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            out[key] = int(rest.split()[0]) / 1024
    return out


class RssSampler:
    """Samples a process's memory on a daemon thread until `stop`; `mark` names a moment
    (a round's start) so the timeline can be read against the bench's phases."""

    def __init__(self, pid: int, interval: float = 0.2, keep: int = 400) -> None:
        self.pid, self.interval, self.keep = pid, interval, keep
        self.t0 = time.monotonic()
        self.peak: dict[str, float] = {}
        self.samples: list[tuple[float, float]] = []  # (s since start, VmRSS MiB)
        self.marks: list[tuple[float, str, float]] = []  # (s, label, VmRSS MiB then)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")
        self._thread.start()

    def _sample(self) -> dict[str, float]:
        now = status_mib(self.pid)
        for k, v in now.items():
            self.peak[k] = max(self.peak.get(k, 0.0), v)
        if "VmRSS" in now:
            self.samples.append((time.monotonic() - self.t0, now["VmRSS"]))
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def mark(self, label: str) -> float | None:
        """Record a named moment; returns VmRSS now (MiB)."""
        rss = self._sample().get("VmRSS")
        self.marks.append((time.monotonic() - self.t0, label, rss or 0.0))
        return rss

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the peaks (MiB, `peak_` + field), the marks and a timeline thinned
        to at most `keep` points (each the maximum of its stretch)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        step = max(1, -(-len(self.samples) // self.keep))
        thin = [
            (round(self.samples[i][0], 1), round(max(v for _, v in self.samples[i : i + step]), 1))
            for i in range(0, len(self.samples), step)
        ]
        return {
            **{f"peak_{k}_mib": round(v, 1) for k, v in self.peak.items()},
            "marks": [(round(t, 1), label, round(v, 1)) for t, label, v in self.marks],
            "timeline": thin,
        }
