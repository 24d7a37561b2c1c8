"""The file fuzzer's child process: ``python -m tests.hardening.fuzz_worker CASES.json``
loads each case (a mutated model file: load, then generate 3 tokens; a mutated demo adapter:
load it against its base's shapes; a mutated tiny adapter: load it into the tiny Gemma's
engine and generate with it) under an address-space limit, and prints one JSON line when a
case starts and one with its outcome (loaded, or the exception's type, whether it is one of
loraserve's own errors, and its message). A crash or hang shows as a start line without an
outcome; the parent (`test_fuzz_files.py`) reruns that case alone to name it."""

from __future__ import annotations

import json
import logging
import resource
import sys
from pathlib import Path
from typing import Any

# the Gemma 3 270M configuration the demo adapters were trained on (the adapter tests need
# its architecture and head counts; its shapes come from the unmutated adapter)
GEMMA_270M = dict(arch="gemma3", vocab_size=262144, hidden_size=640, n_layers=18, n_heads=4,
                  n_kv_heads=1, head_dim=256, ffn_dim=2048, rms_eps=1e-6, rope_theta=1e6,
                  context_length=32768)  # fmt: skip
MEMORY_BUDGET = 3 << 30  # address space a case may add to the worker's


def _ours(e: BaseException) -> bool:
    """One of loraserve's refusals: a ValueError subclass defined in loraserve."""
    return isinstance(e, ValueError) and type(e).__module__.startswith("loraserve.")


def main() -> None:
    logging.disable(logging.WARNING)
    import torch

    from loraserve.engine.engine import Engine
    from loraserve.lora.adapter import load_adapter
    from loraserve.model.config import ModelConfig
    from loraserve.model.loader import load_model
    from tests.engine_util import ask, run_and_drain

    torch.set_num_threads(1)
    spec = json.loads(Path(sys.argv[1]).read_text())
    gemma = ModelConfig(**GEMMA_270M)
    shapes = {k: tuple(v) for k, v in spec["base_shapes"].items()}
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
    limit = vm + MEMORY_BUDGET
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    tiny: list[Engine] = []  # the unmutated tiny model, for adapters of its shapes

    def run(kind: str, path: str) -> None:
        if kind == "model":
            m = load_model(path)
            run_and_drain(Engine(m), [ask([1, 5, 9, 12], n=3)])
        elif kind == "tiny_adapter":  # loaded into the tiny model's engine, then generating
            if not tiny:
                tiny.append(Engine(load_model(spec["tiny_model"])))
            eng = tiny[0]
            a = eng.load_adapter(path, 0.0).result()
            try:
                run_and_drain(eng, [ask([1, 5, 9, 12], n=3, mix={a.id: 1.0})])
            finally:
                eng.unload_adapter(a.id).result()
        else:
            load_adapter(path, gemma, shapes)

    for case in spec["cases"]:
        print(json.dumps({"start": case["id"]}), flush=True)
        out: dict[str, Any] = {"id": case["id"]}
        try:
            run(case["kind"], case["path"])
            out["ok"] = True
        except BaseException as e:  # every outcome is reported, judged by the parent
            out.update(error=type(e).__name__, ours=_ours(e), msg=str(e)[:500])
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
