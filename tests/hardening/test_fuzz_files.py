"""Fuzz of model and adapter files: mutated GGUF headers, metadata and tensor tables (of a tiny
quantized Gemma 3 whose layers run in the fused C call, of the tiny llama, and of the demo
adapters' GGUF file) and mutated PEFT configurations (of the demo adapters' folder), each
loaded in a child process (`fuzz_worker`: a model is loaded and generates 3 tokens, an adapter
is loaded against its base's shapes) with its address space bounded. Zero crashes (no child
dies by a signal), zero hangs (no case past its time), bounded memory (no MemoryError under
the limit), and every refusal one of loraserve's own errors with a one-line message.

Cases are batched per child (one torch import per batch, two children at a time); a batch
whose child dies or stalls is resumed after the case it was running, and that case is rerun
alone to name it. ``LORASERVE_FUZZ_CASES`` (default 800) sets the number of cases,
``LORASERVE_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.hardening.fuzz_gguf import fields, mutate, mutate_peft_config
from tests.hardening.seed_files import ADAPTERS, ROOT, base_shapes, seed_models, tiny_lora

CASES = int(os.environ.get("LORASERVE_FUZZ_CASES", "800"))
SEED = int(os.environ.get("LORASERVE_FUZZ_SEED", "0"))
BATCH = 2000  # cases per child (its start-up, ~5-10 s, costs more than 100 cases)
CASE_TIMEOUT_S = 20.0  # one case alone (a torch import included)
START_S = 30.0  # a batch's child: torch import, kernels


_KINDS = {"gemma_q8": "model", "llama": "model", "tiny_lora": "tiny_adapter"}


def _cases(folder: Path, n: int) -> list[dict[str, Any]]:
    """n mutated cases: 40% tiny Gemma Q8_0, 20% tiny llama, 15% the demo GGUF adapter, 15%
    a tiny Gemma GGUF LoRA (generating with it), 10% the demo PEFT folder's configuration."""
    rng = random.Random(SEED)
    seeds = {**seed_models(folder), "adapter": ADAPTERS / "titlecase.gguf",
             "tiny_lora": tiny_lora(folder / "tiny_lora.gguf")}  # fmt: skip
    parsed = {k: (p.read_bytes(), *fields(p.read_bytes())) for k, p in seeds.items()}
    peft = ADAPTERS / "titlecase"
    conf = json.loads((peft / "adapter_config.json").read_text())
    # the seeds themselves first: each must load (and generate) unmutated
    out = [{"id": i, "kind": _KINDS.get(k, "adapter"), "src": "seed", "path": str(p)}
           for i, (k, p) in enumerate([*seeds.items(), ("peft", peft)])]  # fmt: skip
    for i in range(len(out), len(out) + n):
        r = rng.random()
        src = ("gemma_q8" if r < 0.4 else "llama" if r < 0.6 else "adapter" if r < 0.75
               else "tiny_lora" if r < 0.9 else "peft")  # fmt: skip
        if src == "peft":
            case = folder / f"c{i}"
            case.mkdir()
            (case / "adapter_model.safetensors").symlink_to(peft / "adapter_model.safetensors")
            (case / "adapter_config.json").write_text(mutate_peft_config(conf, rng))
        else:
            data, table, end = parsed[src]
            case = folder / f"c{i}.gguf"
            case.write_bytes(mutate(data, table, end, rng))
        out.append({"id": i, "kind": _KINDS.get(src, "adapter"), "src": src, "path": str(case)})
    return out


def _run(cases: list[dict[str, Any]], spec: dict[str, Any], folder: Path, name: str,
         timeout: float) -> tuple[dict[int, dict[str, Any]], int | None, str]:  # fmt: skip
    """Run cases in one child: their outcomes, the case it was running when it died or
    stalled (None if it finished), and how it ended."""
    path = folder / f"{name}.json"
    path.write_text(json.dumps({**spec, "cases": cases}))
    cmd = [sys.executable, "-m", "tests.hardening.fuzz_worker", str(path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        stdout, ended = p.stdout, f"exit {p.returncode}"
        if p.returncode < 0:
            ended = f"signal {-p.returncode}"
    except subprocess.TimeoutExpired as e:
        raw = e.stdout or b""
        stdout, ended = (raw.decode() if isinstance(raw, bytes) else raw), "timeout"
    results, running = {}, None
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        if "start" in rec:
            running = rec["start"]
        else:
            results[rec["id"]] = rec
            running = None
    if ended == "exit 0" and running is None:
        return results, None, ended
    return results, running if running is not None else -1, ended


def _batch(cases: list[dict[str, Any]], spec: dict[str, Any], folder: Path, tag: str
           ) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """Every case's outcome; cases that crashed or hung (confirmed alone) as failures."""
    results: dict[int, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    todo = cases
    while todo:
        got, culprit, ended = _run(todo, spec, folder, tag, START_S + CASE_TIMEOUT_S * len(todo))
        results.update(got)
        if culprit is None:
            break
        if culprit == -1:  # died before any case started
            failures.append({"id": todo[0]["id"], "ended": f"worker {ended}"})
            break
        case = next(c for c in todo if c["id"] == culprit)
        _, again, alone = _run([case], spec, folder, f"{tag}-alone", START_S + CASE_TIMEOUT_S)
        failures.append({**case, "ended": ended, "alone": alone if again is not None else "ok"})
        todo = todo[todo.index(case) + 1 :]
    return results, failures


def test_mutated_model_and_adapter_files_never_crash_hang_or_escape(tmp_path: Path) -> None:
    cases = _cases(tmp_path, CASES)
    spec = {"base_shapes": base_shapes(ADAPTERS / "titlecase"),
            "tiny_model": str(tmp_path / "gemma_q8.gguf")}  # fmt: skip
    size = min(BATCH, -(-len(cases) // 2))  # two children at a time
    chunks = [cases[i : i + size] for i in range(0, len(cases), size)]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda a: _batch(a[1], spec, tmp_path, f"b{a[0]}"), enumerate(chunks)))
    results = {k: v for r, _ in done for k, v in r.items()}
    failures = [f for _, fs in done for f in fs]
    bad = [r for r in results.values() if "error" in r and not (r["ours"] and "\n" not in r["msg"])]
    by_src = Counter(c["src"] for c in cases)
    loaded = Counter(c["src"] for c in cases if results.get(c["id"], {}).get("ok"))
    errors = Counter(r["error"] for r in results.values() if "error" in r)
    print(f"\nfile fuzz: {len(cases)} cases (seed {SEED}) {dict(by_src)}, loaded {dict(loaded)}, "
          f"refused {dict(errors)}, crashes/hangs {len(failures)}")  # fmt: skip
    assert not failures, f"cases that crashed or hung: {failures[:5]}"
    assert not bad, f"refusals that are not one clear line of ours: {bad[:5]}"
    assert len(results) == len(cases)
    seeds = [c["id"] for c in cases if c["src"] == "seed"]
    assert all(results[i].get("ok") for i in seeds), [results[i] for i in seeds]
    assert sum(loaded.values()) > len(seeds) and sum(errors.values()) > len(cases) // 4
