"""Record llama-server's answers on tiny jamba and nemotron_h_moe files WITH routed experts
(test-llama-archs writes both without them).

jamba: its dense template, the Mamba-1 layer's FFN replaced by 4 routed experts (2 used)
named and shaped as llama.cpp's loader reads them (src/models/jamba.cpp: ``ffn_gate_inp``
[E, n_embd], ``ffn_{gate,up}_exps`` [E, n_ff, n_embd], ``ffn_down_exps`` [E, n_embd, n_ff]);
the attention layer keeps its dense FFN, as Jamba alternates them. Values from the seed as
`tests.arch_models` draws them (Mamba's A negative); Q8_0 / Q4_K_M by llama-quantize. The
answers go to tests/data/archs/jamba.json as its ``moe`` variant
(`scripts/record_arch_cases.record_variant`); tests/unit/model/test_archs.py checks them.

nemotron_h_moe (``python scripts/record_hybrid_experts.py nemotron_h_moe``): its dense
template's FFN layer (layer 2) as 4 routed experts (2 used, 256 wide) without a gate, sigmoid
routing with ``exp_probs_b``, weights renormalised and scaled by 2.5 (Nemotron 3 Nano's
settings), and one 256-wide shared expert (src/models/nemotron-h.cpp's loader); with
``--latent 128`` the experts work in a 128-wide latent space (``ffn_latent_down`` /
``ffn_latent_up``), recorded as tests/data/archs/nemotron_h_moe+latent.json.

    python scripts/record_hybrid_experts.py [jamba|nemotron_h_moe] [--latent N] [--port N]
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


def nemotron_template(dense: Path, out: Path, seed: int, stdev: float, latent: int) -> Path:
    """nemotron_h_moe's dense template with layer 2's FFN as routed and shared experts."""
    spec = rec.template_spec(dense)
    a, h, f, e, b = "nemotron_h_moe.", 256, 256, N_EXPERTS, "blk.2."
    fix = {a + "expert_count": e, a + "expert_used_count": N_USED,
           a + "expert_feed_forward_length": f, a + "expert_shared_feed_forward_length": f,
           a + "expert_shared_count": 1, a + "expert_weights_norm": True,
           a + "expert_weights_scale": 2.5}  # fmt: skip
    spec["metadata"] = [[k, t, fix.get(k, v)] for k, t, v in spec["metadata"]]
    io = latent or h
    if latent:
        spec["metadata"].append([a + "moe_latent_size", "UINT32", latent])
    spec["tensors"] = [
        t for t in spec["tensors"] if not t[0].startswith((b + "ffn_up.", b + "ffn_down."))
    ]
    spec["tensors"] += [[b + "ffn_gate_inp.weight", [e, h], 0], [b + "exp_probs_b.bias", [e], 0],
                        [b + "ffn_up_exps.weight", [e, f, io], 0],
                        [b + "ffn_down_exps.weight", [e, io, f], 0],
                        [b + "ffn_up_shexp.weight", [f, h], 0],
                        [b + "ffn_down_shexp.weight", [h, f], 0]]  # fmt: skip
    if latent:
        spec["tensors"] += [[b + "ffn_latent_down.weight", [latent, h], 0],
                            [b + "ffn_latent_up.weight", [h, latent], 0]]  # fmt: skip
    spec["generator"] = {"seed": seed, "stdev": stdev}
    return write_model(spec, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("arch", nargs="?", default="jamba", choices=("jamba", "nemotron_h_moe"))
    ap.add_argument("--latent", type=int, default=0, help="nemotron_h_moe: a latent width")
    ap.add_argument("--port", type=int, default=18933)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stdev", type=float, default=0.5)
    args = ap.parse_args()
    arch = args.arch
    rec.NEGATIVE_A = arch == "jamba"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([str(rec.PEER / "test-llama-archs"), "-o", str(work), "-a", f"^{arch}$",
                        "-s", str(args.seed), "-d", str(args.stdev)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        dense, out = work / f"{arch}-dense.gguf", work / f"{arch}-moe.gguf"
        if arch == "jamba":
            tmpl = moe_template(dense, out, args.seed, args.stdev)
        else:
            tmpl = nemotron_template(dense, out, args.seed, args.stdev, args.latent)
        variant = rec.record_variant(arch, tmpl, work, args.seed, args.stdev, args.port)
    name = f"{arch}+latent" if args.latent else arch
    path = rec.OUT / f"{name}.json"
    data = json.loads(path.read_text()) if path.exists() else {
        "arch": arch, "peer": "llama.cpp from the llama-cpp-python 0.3.36 sdist",
        "n_predict": rec.N_PREDICT, "n_ctx": 256, "variants": {},
        "tag": "latent", "overrides": [f"moe_latent_size=UINT32:{args.latent}"]}  # fmt: skip
    data["variants"]["moe"] = variant
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
