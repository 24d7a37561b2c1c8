"""Record llama-server's greedy answers on the Qwen3.5 file with an MTP block
(`tests.mtp_models`), F32, on the recorded qwen35 prompts: llama-server loads the block
(for its MTP draft only) and serves the file; the answers land in
tests/data/archs/mtp/qwen35.json.

`python scripts/record_hybrid_mtp.py [--port N]` (llama-server built under the peer dir)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.record_arch_cases import serve_and_ask  # noqa: E402
from tests.arch_models import file_sha256, write_model  # noqa: E402
from tests.mtp_models import DATA, mtp_spec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=18931)
    args = ap.parse_args()
    base = json.loads((DATA / "qwen35.json").read_text())["variants"]["dense"]
    cases = [c["prompt"] for c in base["answers"]["F32"]]
    with tempfile.TemporaryDirectory() as d:
        path = write_model(mtp_spec(), Path(d) / "qwen35-mtp.gguf")
        answers = serve_and_ask(path, cases, args.port)
        out = {"peer": "llama.cpp from the llama-cpp-python 0.3.36 sdist", "n_ctx": 256,
               "sha256": file_sha256(path), "answers": {"F32": answers}}  # fmt: skip
    (DATA / "mtp" / "qwen35.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
