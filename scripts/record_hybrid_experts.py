"""Record llama-server's answers on tiny jamba files WITH routed experts (test-llama-archs
writes jamba without them): its dense template, the Mamba-1 layer's FFN replaced by 4 routed
experts (2 used) named and shaped as llama.cpp's loader reads them (src/models/jamba.cpp:
``ffn_gate_inp`` [E, n_embd], ``ffn_{gate,up}_exps`` [E, n_ff, n_embd], ``ffn_down_exps``
[E, n_embd, n_ff]); the attention layer keeps its dense FFN, as Jamba alternates them. Values
from the seed as `tests.arch_models` draws them (Mamba's A negative); Q8_0 / Q4_K_M by
llama-quantize. The answers go to tests/data/archs/jamba.json as its ``moe`` variant
(`scripts/record_arch_cases.record_variant`); tests/unit/model/test_archs.py checks them.

    python scripts/record_hybrid_experts.py [--port N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import scripts.record_arch_cases as rec  # noqa: E402
from tests.arch_models import write_model  # noqa: E402

N_EXPERTS, N_USED = 4, 2


def moe_template(dense: Path, out: Path, seed: int, stdev: float) -> Path:
    """The dense template with layer 1's FFN as routed experts and the expert counts set."""
    spec = rec.template_spec(dense)
    fix = {"jamba.expert_count": N_EXPERTS, "jamba.expert_used_count": N_USED}
    spec["metadata"] = [[k, t, fix.get(k, v)] for k, t, v in spec["metadata"]]
    h, f, e, b = 256, 384, N_EXPERTS, "blk.1."
    spec["tensors"] = [
        t
        for t in spec["tensors"]
        if not t[0].startswith((b + "ffn_gate.", b + "ffn_up.", b + "ffn_down."))
    ]
    spec["tensors"] += [[b + "ffn_gate_inp.weight", [e, h], 0],
                        [b + "ffn_gate_exps.weight", [e, f, h], 0],
                        [b + "ffn_up_exps.weight", [e, f, h], 0],
                        [b + "ffn_down_exps.weight", [e, h, f], 0]]  # fmt: skip
    spec["generator"] = {"seed": seed, "stdev": stdev, "negative_a": True}
    return write_model(spec, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=18933)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stdev", type=float, default=0.5)
    args = ap.parse_args()
    rec.NEGATIVE_A = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([str(rec.PEER / "test-llama-archs"), "-o", str(work), "-a", "^jamba$",
                        "-s", str(args.seed), "-d", str(args.stdev)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        tmpl = moe_template(work / "jamba-dense.gguf", work / "jamba-moe.gguf", args.seed,
                            args.stdev)  # fmt: skip
        variant = rec.record_variant("jamba", tmpl, work, args.seed, args.stdev, args.port)
    path = rec.OUT / "jamba.json"
    data = json.loads(path.read_text())
    data["variants"]["moe"] = variant
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
