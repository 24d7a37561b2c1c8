"""Requantize the real model into other ggml types with `llama-quantize --allow-requantize` and
record llama-server's greedy answers on each (tests/data/requant_greedy.json).

Each type's file lands in `~/.cache/loraserve/requant/gemma3-270m-<TYPE>.gguf` (next to the real
model; types that need an importance matrix get one from `llama-imatrix` over llama.cpp's own
README). For each file and prompt, llama-server (default f16 KV cache) decodes 32 greedy tokens
with `n_probs: 2`; each position keeps the token, llama-server's top-1/top-2 log-probability
gap and its second token with that token's log-probability. The record also keeps each file's
tensor digest (tests/arch_models.tensor_digest) and its tensor types, so the test knows it
runs on the very file llama-server answered on, or rebuilds it with loraserve's quantizer where
that writes llama-quantize's bytes. Q4_K_M, the source itself, is recorded too (the baseline).

    python scripts/record_requant_reference.py [--types Q4_0,IQ4_XS] [--peer PATH]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench, loraserve, tests

from bench.peer import find_peer, find_quantize  # noqa: E402
from loraserve.model.default import resolve_model_path  # noqa: E402
from tests.arch_models import tensor_digest  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests/data/requant_greedy.json"
# files whose every K-width matrix takes the named types (on this model's n_embd of 640 only
# attn_output and ffn_down have rows of whole 256-blocks, and the IQ2_S / IQ3_XXS ftypes pick
# IQ2_XS and IQ3_S/Q3_K for those): ftype and llama-quantize's extra arguments
# (the last three: types that no ftype writes into this model's 256-wide rows -- its Q2_K
# ftype picks Q3_K for them -- forced, so that every kernel type runs on real weights; the
# ternary ones on three layers' tensors each: the model is not ternary, and with them in
# every layer its logits were chaotic, our exact float32 reference itself no nearer to
# llama-server's tokens than our kernels)
FORCED = {"IQ2_S+IQ3_XXS": ("IQ2_S", ["--tensor-type", "ffn_down=iq2_s",
                                      "--tensor-type", "attn_output=iq3_xxs"]),
          "IQ2_XXS+Q2_K": ("Q2_K", ["--tensor-type", "ffn_down=iq2_xxs",
                                    "--tensor-type", "attn_output=q2_k"]),
          "IQ1_S+IQ1_M": ("IQ1_M", ["--tensor-type", "ffn_down=iq1_s",
                                    "--tensor-type", "attn_output=iq1_m"]),
          "TQ1_0+TQ2_0": ("Q4_K_M", ["--tensor-type", r"blk\.(3|9|15)\.ffn_down=tq1_0",
                                     "--tensor-type",
                                     r"blk\.(4|10|16)\.attn_output=tq2_0"])}  # fmt: skip
SOURCE = "Q4_K_M"  # the real model's own type: recorded as the baseline, not requantized
TYPES = [SOURCE, "Q4_0", "Q5_1", "Q2_K", "Q3_K_M", "Q5_K_M",
         "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", *FORCED]  # fmt: skip
NEEDS_IMATRIX = {"IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M"}
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "Water boils at a temperature of",
]
N_PREDICT = 32


def requant_path(model: Path, qtype: str) -> Path:
    """Where the requantized file of ``qtype`` lives, beside the real model."""
    return model.parent / "requant" / f"gemma3-270m-{qtype}.gguf"


def imatrix(model: Path, quantize: Path) -> Path:
    """An importance matrix of the real model over llama.cpp's README (16 chunks of 512)."""
    out = model.parent / "requant" / "imatrix.gguf"
    if not out.exists():
        tool = quantize.with_name("llama-imatrix")
        if not tool.exists():
            raise SystemExit(f"{tool} missing: cmake --build build --target llama-imatrix")
        text = quantize.parents[2] / "README.md"
        tmp = out.with_name(f".tmp-{out.name}")  # its suffix picks the format
        subprocess.run([str(tool), "-m", str(model), "-f", str(text), "-o", str(tmp),
                        "-c", "512", "--chunks", "16", "-t", "2"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        tmp.replace(out)
    return out


def needs_imatrix(qtype: str) -> bool:
    """Whether the file's ftype or a type forced on some tensors needs an importance matrix."""
    ftype, extra = FORCED.get(qtype, (qtype, []))
    forced = [a.split("=")[1].upper() for a in extra[1::2]]
    return any(t in NEEDS_IMATRIX for t in [ftype, *forced])


def requantize(model: Path, qtype: str, quantize: Path) -> Path:
    if qtype == SOURCE:
        return model  # the baseline: the source file itself
    path = requant_path(model, qtype)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        ftype, extra = FORCED.get(qtype, (qtype, []))
        cmd = [str(quantize), "--allow-requantize", *extra]
        if needs_imatrix(qtype):
            cmd += ["--imatrix", str(imatrix(model, quantize))]
        tmp = path.with_name(f".tmp-{path.name}")  # renamed once whole: no half file read
        cmd += [str(model), str(tmp), ftype, "1"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tmp.replace(path)
    return path


def record(peer: Path, path: Path, port: int) -> list[dict]:
    cmd = [str(peer), "-m", str(path), "--port", str(port), "-t", "1", "-np", "1", "-c", "2048"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        out = []
        for prompt in PROMPTS:
            body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "n_probs": 2,
                    "cache_prompt": False, "return_tokens": True, "ignore_eos": True}  # fmt: skip
            r = httpx.post(f"{base}/completion", json=body, timeout=300).json()
            probs = r["completion_probabilities"]
            gaps, top2 = [], []
            for p in probs:
                top = p["top_logprobs"] if "top_logprobs" in p else p["top_probs"]
                lp = [t["logprob"] if "logprob" in t else math.log(t["prob"]) for t in top]
                gaps.append(round(lp[0] - lp[1], 6))
                top2.append([top[1]["id"], round(lp[1], 6)])
            out.append({"prompt": prompt, "tokens": [p["id"] for p in probs], "gap": gaps,
                        "second": top2, "text": r["content"]})  # fmt: skip
            print(f"  {prompt[:30]!r}: {r['content'][:60]!r}")
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--peer", type=Path, default=None)
    ap.add_argument("--port", type=int, default=18479)
    args = ap.parse_args()
    peer, quantize = args.peer or find_peer(), find_quantize()
    if peer is None or quantize is None:
        raise SystemExit("no llama-server / llama-quantize: python -m bench.peer --build")
    model = resolve_model_path(None)
    data = json.loads(OUT.read_text()) if OUT.exists() else {"files": {}}
    data["meta"] = {"peer": "llama-server from the llama-cpp-python 0.3.36 sdist (f16 KV cache)",
                    "source": model.name, "n_predict": N_PREDICT,
                    "file": "requant/gemma3-270m-<TYPE>.gguf beside the source"}  # fmt: skip
    for qtype in args.types.split(","):
        path = requantize(model, qtype, quantize)
        digest, types = tensor_digest(path)
        print(f"{qtype}: {path}")
        data["files"][qtype] = {"tensors_sha256": digest, "types": types,
                                "imatrix": needs_imatrix(qtype),
                                "records": record(peer, path, args.port)}  # fmt: skip
        OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
