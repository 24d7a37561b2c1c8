"""Record llama.cpp's greedy answers on Gemma 3 270M as test data (tests/data/peer_greedy.json).

For each prompt and adapter mix (none, and the demo adapters alone and together), llama-server
decodes 32 greedy tokens with `n_probs: 2`; each position keeps the token and llama.cpp's own
top-1/top-2 logit gap (ln p1 - ln p2: both probabilities share one softmax normalizer). The
fidelity test teacher-forces loraserve on these tokens and requires the same top-1 wherever
that gap is at least 0.5.

    python scripts/record_peer_reference.py [--peer PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench, loraserve

from bench.peer import find_peer  # noqa: E402
from loraserve.adapters import gguf_path  # noqa: E402
from loraserve.model.default import resolve_model_path  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests/data/peer_greedy.json"
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "Water boils at a temperature of",
]
MIXES = {"base": [0.0, 0.0], "uppercase": [1.0, 0.0], "titlecase": [0.0, 1.0], "both": [0.5, 0.5]}
N_PREDICT = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--peer", type=Path, default=None)
    ap.add_argument("--port", type=int, default=18473)
    args = ap.parse_args()
    peer = args.peer or find_peer()
    if peer is None:
        raise SystemExit("no llama-server: python -m bench.peer --build")
    model = resolve_model_path(None)
    adapters = [gguf_path("uppercase"), gguf_path("titlecase")]
    cmd = [str(peer), "-m", str(model), "--port", str(args.port), "-t", "2", "-np", "1",
           "-c", "2048", "--lora-init-without-apply"]  # fmt: skip
    for a in adapters:
        cmd += ["--lora", str(a)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(120):
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        records = []
        for prompt in PROMPTS:
            for mix, scales in MIXES.items():
                body = {
                    "prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "n_probs": 2,
                    "cache_prompt": False, "return_tokens": True, "ignore_eos": True,
                    "lora": [{"id": i, "scale": s} for i, s in enumerate(scales)],
                }  # fmt: skip
                r = httpx.post(f"{base}/completion", json=body, timeout=300).json()
                probs = r["completion_probabilities"]
                tokens = [p["id"] for p in probs]
                gaps = []
                for p in probs:
                    top = p["top_logprobs"] if "top_logprobs" in p else p["top_probs"]
                    lp = [t["logprob"] if "logprob" in t else math.log(t["prob"]) for t in top]
                    gaps.append(lp[0] - lp[1])
                records.append({"prompt": prompt, "mix": mix, "scales": scales,
                                "tokens": tokens, "gap": gaps, "text": r["content"]})  # fmt: skip
                print(f"{mix:10s} {prompt[:30]!r}: {r['content'][:60]!r}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    meta = {"peer": "llama-server from the llama-cpp-python 0.3.36 sdist", "model": model.name,
            "adapters": [a.name for a in adapters], "n_predict": N_PREDICT}  # fmt: skip
    OUT.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
