"""Check the recorded converter layouts (tests/data/converted) against llama-server.

Each layout is written with random values (tests/unit/model/test_converted_layouts.spec, stdev
0.3), started in the peer's llama-server (greedy, 4 tokens after 5 prompt ids, top-2 log-probs),
and loraserve's teacher-forced probabilities of llama-server's tokens are compared: one line per
layout (tokens, whether each is our argmax, the largest probability difference), or
"llama-server refused". Not a test (CI has no peer); run it after re-recording:

    python -m scripts.check_converted_peer [LAYOUT ...]   (from the repository root)

Never run beside a timed run: it starts llama-server (1 thread) once per layout.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.model.loader import load_model
from tests.arch_models import write_model
from tests.unit.model.test_converted_layouts import LAYOUTS, spec

SERVER = Path.home() / (".cache/loraserve/peer/llama_cpp_python-0.3.36/vendor/llama.cpp/"
                        "build/bin/llama-server")  # fmt: skip
URL = "http://localhost:18437"
PROMPT = [5, 9, 77, 3, 12]


def peer(path: Path) -> list[tuple[int, float]] | None:
    """llama-server's greedy tokens after PROMPT with their probabilities; None if it refused."""
    cmd = [str(SERVER), "-m", str(path), "--port", URL.rsplit(":", 1)[1], "-t", "1",
           "-c", "256", "-np", "1"]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(60):
            time.sleep(0.5)
            try:
                if b"ok" in urllib.request.urlopen(URL + "/health", timeout=1).read():
                    break
            except OSError:
                if p.poll() is not None:
                    return None
        else:
            return None
        body = json.dumps({"prompt": PROMPT, "n_predict": 4, "n_probs": 2, "temperature": 0,
                           "cache_prompt": False}).encode()  # fmt: skip
        req = urllib.request.Request(URL + "/completion", body,
                                     {"Content-Type": "application/json"})  # fmt: skip
        out = json.loads(urllib.request.urlopen(req, timeout=60).read())
        return [(c["id"], math.exp(c["logprob"])) for c in out["completion_probabilities"]]
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()


def ours(path: Path, seq: list[int], n: int) -> torch.Tensor:
    """loraserve's float32 probabilities [n, V] at the last n positions of seq."""
    runner = ModelRunner(load_model(path).decoder, 4, torch.float32)
    blocks = -(-len(seq) // 4)
    runner.ensure_capacity(blocks)
    item = BatchItem(seq, 0, len(seq), list(range(blocks)), True, {}, n_logits=n)
    return runner.forward([item]).softmax(-1)


def main() -> None:
    out_dir = Path("/tmp/loraserve-converted-peer")
    out_dir.mkdir(exist_ok=True)
    for arch in sys.argv[1:] or sorted(LAYOUTS):
        path = write_model(spec(arch, stdev=0.3), out_dir / f"{arch}.gguf")
        got = peer(path)
        if got is None:
            print(f"{arch}: llama-server refused", flush=True)
            continue
        toks = [t for t, _ in got]
        pr = ours(path, PROMPT + toks[:-1], len(toks))
        same = all(int(pr[i].argmax()) == t for i, t in enumerate(toks))
        diff = max(abs(float(pr[i, t]) - p) for i, (t, p) in enumerate(got))
        print(f"{arch}: tokens {toks} our argmax {same} max|p diff| {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
