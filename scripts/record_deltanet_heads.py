"""Record llama-server's answers on tiny delta-net models whose value heads outnumber their key
heads (tests/data/archs/deltanet/<arch>+heads.json), as every real Qwen3.5 / Qwen3-Next has
and `test-llama-archs`' template does not (2 key heads, 2 value heads).

From the template ``test-llama-archs -o DIR -a ^ARCH$`` writes, the delta-net sizes become 2 key
heads and 4 value heads of 128 (``ssm.group_count`` 2, ``ssm.time_step_rank`` 4,
``ssm.inner_size`` 512) and each delta-net tensor's shape follows; the rest is
`record_arch_cases`' flow: our GGUF writer draws the values from the seed, ``llama-quantize``
makes the quantized files, ``llama-server`` answers the prompts greedily with its top-2
log-probabilities. Value head h reads key head h % 2 in qwen35 (ggml's repeat) and h // 2 in
qwen3next (its converter's interleave), so these records tell the two mappings apart. With
``--legacy`` (qwen3next), the file has early Qwen3-Next GGUFs' layout: q, k, v and z in one
``ssm_in``, no ``attn_qkv``/``attn_gate`` (written to ``<arch>+ssm_in.json``).

    python scripts/record_deltanet_heads.py [ARCH ...] [--seed 1] [--stdev 0.5] [--legacy]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # loraserve, tests

from scripts.record_arch_cases import (  # noqa: E402
    PEER,
    prompts,
    serve_and_ask,
    template_spec,
    used_tensors,
)
from tests.arch_models import file_sha256, tensor_digest, write_model  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests/data/archs/deltanet"
K_HEADS, V_HEADS, S = 2, 4, 128
TYPES = ("Q4_K_M",)


def widen(spec: dict[str, Any], arch: str) -> None:
    """The template's delta-net sizes and tensor shapes -> K_HEADS key, V_HEADS value heads."""
    sets = {"ssm.group_count": K_HEADS, "ssm.time_step_rank": V_HEADS,
            "ssm.inner_size": V_HEADS * S, "ssm.state_size": S}  # fmt: skip
    for m in spec["metadata"]:
        key = m[0].removeprefix(f"{arch}.")
        if key in sets:
            m[2] = sets[key]
    conv, value = 2 * K_HEADS * S + V_HEADS * S, V_HEADS * S
    for t in spec["tensors"]:
        stem = t[0].split(".", 2)[-1]
        shape = {"attn_qkv.weight": [conv, t[1][-1]], "ssm_conv1d.weight": [conv, t[1][-1]],
                 "attn_gate.weight": [value, t[1][-1]], "ssm_out.weight": [t[1][0], value],
                 "ssm_beta.weight": [V_HEADS, t[1][-1]], "ssm_alpha.weight": [V_HEADS, t[1][-1]],
                 "ssm_ba.weight": [2 * V_HEADS, t[1][-1]], "ssm_dt.bias": [V_HEADS],
                 "ssm_a": [V_HEADS], "ssm_in.weight": [2 * K_HEADS * S + 2 * value, t[1][-1]],
                 }.get(stem)  # fmt: skip
        if shape is not None:
            t[1] = shape


def record(arch: str, tmpl: Path, work: Path, seed: int, stdev: float, port: int,
           legacy: bool = False) -> dict:  # fmt: skip
    spec = template_spec(tmpl)
    widen(spec, arch)
    if legacy:  # early qwen3next files: ssm_in alone, no attn_qkv / attn_gate
        fused = ("attn_qkv.weight", "attn_gate.weight")
        spec["tensors"] = [t for t in spec["tensors"] if not t[0].endswith(fused)]
    spec["generator"] = {"seed": seed, "stdev": stdev, "template": tmpl.name}
    full = write_model(spec, work / "full.gguf")
    keep = used_tensors(full)
    spec["dropped_tensors"] = [n for n, _, _ in spec["tensors"] if n not in keep]
    spec["tensors"] = [t for t in spec["tensors"] if t[0] in keep]
    f32 = write_model(spec, work / f"{arch}-F32.gguf")
    files = {"F32": {"sha256": file_sha256(f32), "tensors_sha256": tensor_digest(f32)[0]}}
    paths = {"F32": f32}
    for qtype in TYPES:
        q = work / f"{arch}-{qtype}.gguf"
        subprocess.run([str(PEER / "llama-quantize"), str(f32), str(q), qtype], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        digest, types = tensor_digest(q)
        ours = write_model(spec, work / f"{arch}-{qtype}-ours.gguf", types)
        same = tensor_digest(ours)[0] == digest
        print(f"  {qtype}: types {sorted(set(types.values()))}, our quantizer exact: {same}")
        files[qtype] = {"tensors_sha256": digest, "types": types, "ours_exact": same}
        paths[qtype] = q
    cases = prompts(seed, 128)
    answers = {}
    for t, p in paths.items():
        answers[t] = serve_and_ask(p, cases, port)
        gaps = [a[0][1] - a[1][1] for c in answers[t] for a in c["top2"]]
        print(f"  {t}: {sum(g >= 0.5 for g in gaps)}/{len(gaps)} positions decided")
    return {**spec, "files": files, "answers": answers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("archs", nargs="*", default=["qwen35", "qwen3next"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stdev", type=float, default=0.5)
    ap.add_argument("--port", type=int, default=18734)
    ap.add_argument("--legacy", action="store_true",
                    help="qwen3next's early layout: one ssm_in (ARCH+ssm_in.json)")  # fmt: skip
    args = ap.parse_args()
    tag = "ssm_in" if args.legacy else "heads"
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for arch in args.archs:
            subprocess.run([str(PEER / "test-llama-archs"), "-o", str(work), "-a", f"^{arch}$",
                            "-s", str(args.seed), "-d", str(args.stdev)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            tmpl = next(work.glob(f"{arch}-*.gguf"))
            variant = tmpl.stem.removeprefix(f"{arch}-")
            print(f"{arch} ({variant}), {K_HEADS} key heads, {V_HEADS} value heads")
            rec = {"arch": arch, "peer": "llama.cpp from the llama-cpp-python 0.3.36 sdist",
                   "n_predict": 24, "n_ctx": 256, "tag": tag,
                   "variants": {variant: record(arch, tmpl, work, args.seed, args.stdev,
                                                args.port, args.legacy)}}  # fmt: skip
            tmpl.unlink()
            out = OUT / f"{arch}+{tag}.json"
            out.write_text(json.dumps(rec, separators=(",", ":")) + "\n")
            print(f"wrote {out}")


if __name__ == "__main__":
    main()
