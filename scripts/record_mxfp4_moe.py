"""Record llama-server's answers on a tiny random gpt-oss MoE in MXFP4 (tests/data/mxfp4_moe.json).

As scripts/record_arch_cases.py does for every architecture: ``test-llama-archs`` writes
gpt-oss's MoE template, loraserve's writer the F32 model with our own values from the seed,
then ``llama-quantize ... MXFP4_MOE`` turns it into what gpt-oss ships as (the expert tensors in
MXFP4, every other matrix in Q8_0), whose tensor types and bytes are recorded so the test
rebuilds the file with `loraserve.model.quantize`; llama-server answers a few token-id prompts
greedily with top-2 log-probabilities on both files.

    python scripts/record_mxfp4_moe.py [--seed 1] [--stdev 0.5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # loraserve, scripts, tests

from scripts.record_arch_cases import N_PREDICT, PEER, record_variant  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests/data/mxfp4_moe.json"
ARCH = "gpt-oss"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stdev", type=float, default=0.5)
    ap.add_argument("--port", type=int, default=18493)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([str(PEER / "test-llama-archs"), "-o", str(work), "-a", f"^{ARCH}$",
                        "-s", str(args.seed), "-d", str(args.stdev)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        rec = record_variant(ARCH, work / f"{ARCH}-moe.gguf", work, args.seed, args.stdev,
                             args.port, types=("MXFP4_MOE",))  # fmt: skip
    out = {"arch": ARCH, "peer": "llama.cpp from the llama-cpp-python 0.3.36 sdist",
           "n_predict": N_PREDICT, "n_ctx": 256, "variants": {"moe": rec}}  # fmt: skip
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
