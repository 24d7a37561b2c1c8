"""S8 (scaling): memory, start-up and speed of both servers as the model grows.

For Gemma 3 270M (the real default model) and random-weights Gemma 3 1B and 4B of the real
shapes (`bench.synth`), each server, one at a time, on `-np 1 -c 2048` with the run's thread
count, gets:

- a cold start: launch to a healthy `/health` with HOME, XDG_CACHE_HOME, loraserve's cache
  variables and torch's compile caches pointed at a fresh, empty temporary folder (the model
  file itself may be in the OS page cache: this is "no application cache", not a cold disk;
  loraserve's C kernels are the ones its install step, `loraserve build-kernels`, put in the
  package, as llama-server's binary is built at install too);
- a warm start: the second launch, with whatever the first one left in that folder;
- on the warm instance: prefill tok/s (a 512-token prompt, `n_predict` 1, cache off) and
  single-stream decode tok/s (64 tokens after a 128-token prompt);
- peak RSS: the larger of the server's own VmHWM and the sampled resident memory of its
  process tree (children such as compile workers included), over both starts;
- the CPU cores other processes kept busy during the requests (`other_cores`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.scenarios import Target, s1_prefill, s2_decode, warm_up
from bench.servers import CpuMeter, ServerKind, free_port, launch, machine_load, server_argv

MODELS = ("270m", "1b", "4b")
LABELS = {"270m": "270M", "1b": "1B", "4b": "4B"}
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True)
class S8Plan:
    """Sizes and caps of S8; `cap` bounds each model's requests on one server."""

    models: tuple[str, ...] = MODELS
    threads: int = 2
    n_prompt: int = 512
    prefill_reps: int = 2
    decode_prompt: int = 128
    n_predict: int = 64
    decode_reps: int = 3  # the median of three: one 64-token run varied by +-8% here
    cap: float = 240.0
    launch_timeout: float = 300.0


def parse_models(text: str) -> tuple[str, ...]:
    """`270m,1b` -> ("270m", "1b"), in S8's order; unknown names raise ValueError."""
    names = {n.strip().lower() for n in text.split(",") if n.strip()}
    unknown = names - set(MODELS)
    if unknown:
        raise ValueError(f"unknown S8 model(s) {sorted(unknown)}; choose from {list(MODELS)}")
    return tuple(m for m in MODELS if m in names)


def resolve_models(names: tuple[str, ...]) -> tuple[dict[str, Path], dict[str, str]]:
    """The GGUF of each model (synthesizing missing ones), and why any is unavailable."""
    from bench.synth import synth_model
    from loraserve.model.default import default_model_path

    paths, errors = {}, {}
    for name in names:
        try:
            paths[name] = default_model_path() if name == "270m" else synth_model(name)
        except Exception as e:  # one missing model must not cancel the others
            errors[name] = f"{type(e).__name__}: {e}"
    return paths, errors


def _tree_kib(root: int) -> int:
    """Resident KiB of `root` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KIB
        except (OSError, IndexError, ValueError):
            pass
    return total


class TreeRss:
    """Peak resident memory of a process tree, sampled every `period` s in a thread; pass
    `start` as `launch`'s `on_spawn`."""

    def __init__(self, period: float = 0.1) -> None:
        self.period = period
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, proc: Any) -> None:
        """Begin sampling the tree rooted at `proc.pid`."""

        def loop() -> None:
            while not self._stop.is_set():
                self.peak_kib = max(self.peak_kib, _tree_kib(proc.pid))
                self._stop.wait(self.period)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        """Stop sampling; the peak in MiB (None if nothing was sampled)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.peak_kib / 1024 if self.peak_kib else None


def cold_env(home: Path) -> dict[str, str]:
    """Environment overrides that give a server empty caches under `home`."""
    cache = home / ".cache"
    return {
        "HOME": str(home),
        "XDG_CACHE_HOME": str(cache),
        "LORASERVE_CACHE": str(cache / "loraserve"),
        "LORASERVE_MODEL_CACHE": str(cache / "loraserve"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "torchinductor"),
        "TRITON_CACHE_DIR": str(home / "triton"),
    }


def _workload(url: str, plan: S8Plan, encode: Any, bos: tuple[int, ...]) -> dict[str, Any]:
    t = Target(url, 0, encode, bos, time.monotonic() + plan.cap)
    warm_up(t)
    pre = s1_prefill(t, plan.n_prompt, plan.prefill_reps, cap=plan.cap / 2)
    dec = s2_decode(t, plan.decode_prompt, plan.n_predict, reps=plan.decode_reps, cap=plan.cap / 2)
    return {"prefill_tok_s": pre["prefill_tok_s"], "decode_tok_s": dec["decode_tok_s"],
            "prefill": pre, "decode": dec}  # fmt: skip


def s8_one(
    kind: ServerKind, model: Path, plan: S8Plan, encode: Any, bos: tuple[int, ...]
) -> dict[str, Any]:
    """S8 for one server and one model: cold and warm start, prefill, decode, peak RSS."""
    home = Path(tempfile.mkdtemp(prefix="bench-s8-home-"))
    out: dict[str, Any] = {"model": model.name, "load1_before": machine_load()["load1"]}
    peaks: list[float] = []
    try:
        for phase in ("cold", "warm"):
            port, rss = free_port(), TreeRss()
            argv = server_argv(kind, model, port, threads=plan.threads, parallel=1, ctx=2048,
                               cache_ram=0)  # fmt: skip
            try:
                with launch(kind.name, argv, port, plan.launch_timeout, env=cold_env(home),
                            on_spawn=rss.start) as srv:  # fmt: skip
                    out[f"{phase}_start_s"] = srv.startup_s
                    if phase == "warm":
                        meter = CpuMeter(srv.proc.pid)
                        out.update(_workload(srv.url, plan, encode, bos))
                        out["other_cores"] = meter.other_cores()
                    hwm = srv.peak_rss_mib()
                    out[f"{phase}_main_hwm_mib"] = hwm
                    peaks += [hwm] if hwm else []
            finally:
                tree = rss.stop()
                out[f"{phase}_tree_peak_mib"] = tree
                peaks += [tree] if tree else []
    except Exception as e:  # recorded (LaunchError included); the other models still run
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(home, ignore_errors=True)
    out["peak_rss_mib"] = max(peaks) if peaks else None
    return out


def run_s8(
    kinds: list[ServerKind], plan: S8Plan, encode: Any, bos: tuple[int, ...]
) -> dict[str, Any]:
    """S8 for every model of `plan` and every server, model by model, servers one after the
    other: `{"meta": ..., "servers": {name: {"s8": {model: ...}, "errors": {...}}}}`."""
    t0 = time.monotonic()
    meta: dict[str, Any] = {"timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
                            "load_before": machine_load(), "plan": asdict(plan)}  # fmt: skip
    paths, missing = resolve_models(plan.models)
    meta["models"] = {
        n: {"label": LABELS[n], "file": p.name, "file_mib": p.stat().st_size / 2**20}
        for n, p in paths.items()
    }
    servers: dict[str, Any] = {k.name: {"s8": {}, "errors": {}} for k in kinds}
    for name in plan.models:
        for kind in kinds:
            errors = servers[kind.name]["errors"]
            if name in missing:
                errors[f"s8-{name}"] = missing[name]
                continue
            print(f"bench: S8 {LABELS[name]} on {kind.name}", file=sys.stderr)
            res = s8_one(kind, paths[name], plan, encode, bos)
            servers[kind.name]["s8"][name] = res
            if "error" in res:
                errors[f"s8-{name}"] = res["error"]
    meta["load_after"] = machine_load()
    meta["wall_s"] = time.monotonic() - t0
    return {"meta": meta, "servers": servers}


def merge(results: dict[str, Any], s8: dict[str, Any]) -> dict[str, Any]:
    """Put an S8 run into a results dict (S1-S7 of another run, or a fresh skeleton)."""
    results["s8"] = s8["meta"]
    for name, part in s8["servers"].items():
        server = results["servers"].setdefault(name, {})
        server["s8"] = part["s8"]
        errors = {k: v for k, v in server.get("errors", {}).items() if not k.startswith("s8-")}
        server["errors"] = {**errors, **part["errors"]}
    return results


def base_results(out: Path) -> dict[str, Any] | None:
    """The results behind `out/latest.md` (its "Raw results" JSON), if there are any."""
    try:
        text = (out / "latest.md").read_text()
        name = text.split("Raw results: `", 1)[1].split("`", 1)[0]
        return json.loads((out / Path(name).name).read_text())
    except (OSError, IndexError, ValueError):
        return None
