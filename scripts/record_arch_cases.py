"""Record llama-server's answers on tiny random models of each architecture (tests/data/archs/).

For each architecture (and its dense / MoE variants), as llama.cpp's own test does:

1. ``test-llama-archs -o DIR -a ^ARCH$`` writes its template model; its metadata (typed) and
   tensor table, kept to the tensors loraserve's decoder reads, become the spec.
2. loraserve's GGUF writer writes the spec's F32 model with our own values from the seed
   (`tests.arch_models`); ``llama-quantize`` turns it into Q8_0 and Q4_K_M, whose tensor types
   and bytes (sha256) are recorded: the tests rebuild those with `loraserve.model.quantize`.
3. ``llama-server`` on each file answers a few token-id prompts greedily with ``n_probs: 2``:
   every position keeps its token and top-2 log-probabilities. The tests teacher-force loraserve
   on these tokens (the reference prefix resent at every position, so a near-tie never drifts
   the comparison) and require llama-server's top-1 wherever its top-1/top-2 gap is >= 0.5.

    python scripts/record_arch_cases.py [ARCH ...] [--seed 1] [--stdev 0.5]
    python scripts/record_arch_cases.py ARCH --tag NAME --set KEY=TYPE:VALUE ... [--ctx N]

With ``--tag``, the template's metadata is changed as ``--set`` says (``KEY`` without the
``<arch>.`` prefix, ``TYPE`` a GGUF type name such as UINT32, FLOAT32, STRING or
ARRAY:INT32 with a JSON value) and the answers go to ``tests/data/archs/<arch>+<tag>.json``:
a variant llama.cpp's generator does not write (a partial rope, YaRN, long rope factors).
``--ctx`` sets llama-server's context (recorded as ``n_ctx``: llama.cpp picks phi3's long rope
factors from it); ``--prompt-lens`` the prompts' lengths (long ones reach llama4's chunks).

Needs the peer's build (llama-server, llama-quantize, test-llama-archs) in
~/.cache/loraserve/peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin. Model files are
written to a temporary folder and never kept.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # loraserve, tests

from loraserve.model.gguf import GGUFFile  # noqa: E402
from loraserve.model.loader import load_model  # noqa: E402
from loraserve.model.weights import WeightSource  # noqa: E402
from tests.arch_models import file_sha256, tensor_digest, write_model  # noqa: E402

PEER = Path.home() / ".cache/loraserve/peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
OUT = Path(__file__).resolve().parent.parent / "tests/data/archs"
TYPES = ("Q8_0", "Q4_K_M")
N_PREDICT = 24
PROMPT_LENS = (4, 9, 16, 27)
NEGATIVE_A = False  # --negative-a


def template_spec(gguf_path: Path) -> dict[str, Any]:
    """The template's metadata ([key, type, value], empty arrays left out) and tensor table
    ([name, torch-order shape, ggml type])."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(gguf_path)
    meta = []
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = f.contents()
        vtype = f.types[0].name
        if f.types[0] == GGUFValueType.ARRAY:
            if not value:
                continue
            vtype = "ARRAY:" + f.types[-1].name
        if isinstance(value, float) and not np.isfinite(value):
            value = str(value)
        meta.append([key, vtype, value])
    with GGUFFile(gguf_path) as gg:
        tensors = [[n, list(t.shape), t.ggml_type] for n, t in gg.tensors.items()]
    return {"metadata": meta, "tensors": tensors}


def used_tensors(path: Path) -> set[str]:
    """The tensors loraserve's decoder reads from a model file (float32 precision)."""
    seen: set[str] = set()
    has, raw = WeightSource.has, WeightSource.raw

    def track_has(self: WeightSource, name: str) -> bool:
        found = has(self, name)
        if found:
            seen.add(name)
        return found

    def track_raw(self: WeightSource, name: str) -> Any:
        seen.add(name)
        return raw(self, name)

    WeightSource.has, WeightSource.raw = track_has, track_raw  # type: ignore[method-assign]
    try:
        load_model(path, precision="float32")
        load_model(path)
    finally:
        WeightSource.has, WeightSource.raw = has, raw  # type: ignore[method-assign]
    return seen


def prompts(seed: int, n_vocab: int, lens: tuple[int, ...] = PROMPT_LENS) -> list[list[int]]:
    rng = np.random.default_rng([seed, 7])
    return [rng.integers(0, n_vocab, n).tolist() for n in lens]


def serve_and_ask(
    model: Path, cases: list[list[int]], port: int, ctx: int = 256
) -> list[dict[str, Any]]:
    """llama-server's greedy tokens and top-2 log-probabilities for each prompt."""
    cmd = [str(PEER / "llama-server"), "-m", str(model), "--port", str(port), "-t", "2",
           "-np", "1", "-c", str(ctx), "--no-warmup"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {proc.stderr.read()[-2000:]}")
            time.sleep(0.25)
        out = []
        for p in cases:
            body = {"prompt": p, "n_predict": N_PREDICT, "temperature": 0, "n_probs": 2,
                    "cache_prompt": False, "ignore_eos": True}  # fmt: skip
            r = httpx.post(f"{base}/completion", json=body, timeout=300).json()
            probs = r["completion_probabilities"]
            out.append({
                "prompt": p,
                "tokens": [e["id"] for e in probs],
                "top2": [[[t["id"], t["logprob"]] for t in e["top_logprobs"][:2]] for e in probs],
            })  # fmt: skip
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def vocab_cases(model: Path, port: int) -> dict[str, Any]:
    """llama-server's /tokenize and /detokenize on the test vocabulary."""
    texts = ["Hello world", "", "a", "abcde", "abcdef", "  spaces  and\ttabs\n", "ünïcödé ✓ 中文",
             "The quick brown fox jumps over the lazy dog."]  # fmt: skip
    cmd = [str(PEER / "llama-server"), "-m", str(model), "--port", str(port), "-c", "256"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.25)
        tok = [httpx.post(f"{base}/tokenize", json={"content": t, "add_special": True}).json()
               ["tokens"] for t in texts]  # fmt: skip
        ids = [[0, 1, 8, 15, 16, 30, 127], list(range(128))]
        detok = [httpx.post(f"{base}/detokenize", json={"tokens": i}).json()["content"]
                 for i in ids]  # fmt: skip
        return {"tokenize": list(zip(texts, tok, strict=True)),
                "detokenize": list(zip(ids, detok, strict=True))}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def override(spec: dict[str, Any], arch: str, sets: list[str]) -> None:
    """Change the spec's metadata as ``--set KEY=TYPE:VALUE`` entries say (added if absent)."""
    meta = spec["metadata"]
    for item in sets:
        key, _, tv = item.partition("=")
        vtype, _, raw = tv.partition(":")
        if vtype == "ARRAY":  # ARRAY:INT32:[...]
            sub, _, raw = raw.partition(":")
            vtype = f"ARRAY:{sub}"
        value = raw if vtype == "STRING" else json.loads(raw)
        full = f"{arch}.{key}"
        meta[:] = [m for m in meta if m[0] != full] + [[full, vtype, value]]


def record_variant(arch: str, tmpl: Path, work: Path, seed: int, stdev: float, port: int,
                   sets: list[str] = (), ctx: int = 256, lens: tuple[int, ...] = PROMPT_LENS,
                   types: tuple[str, ...] = TYPES) -> dict[str, Any]:  # fmt: skip
    spec = template_spec(tmpl)
    override(spec, arch, list(sets))
    spec["generator"] = {"seed": seed, "stdev": stdev, "template": tmpl.name}
    if NEGATIVE_A:  # Mamba's A drawn negative, as test-llama-archs draws it
        spec["generator"]["negative_a"] = True
    full = write_model(spec, work / "full.gguf")
    keep = used_tensors(full)
    spec["dropped_tensors"] = [n for n, _, _ in spec["tensors"] if n not in keep]
    spec["tensors"] = [t for t in spec["tensors"] if t[0] in keep]
    f32 = write_model(spec, work / f"{arch}-F32.gguf")
    digest, _ = tensor_digest(f32)
    files = {"F32": {"sha256": file_sha256(f32), "tensors_sha256": digest}}
    paths = {"F32": f32}
    for qtype in types:
        q = work / f"{arch}-{qtype}.gguf"
        subprocess.run([str(PEER / "llama-quantize"), str(f32), str(q), qtype], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        digest, types = tensor_digest(q)
        ours = write_model(spec, work / f"{arch}-{qtype}-ours.gguf", types)
        same = tensor_digest(ours)[0] == digest
        print(f"  {qtype}: types {sorted(set(types.values()))}, our quantizer exact: {same}")
        files[qtype] = {"tensors_sha256": digest, "types": types, "ours_exact": same}
        paths[qtype] = q
    cases = prompts(seed, 128, lens)
    answers = {}
    for t, p in paths.items():
        answers[t] = serve_and_ask(p, cases, port, ctx)
        gaps = [a[0][1] - a[1][1] for c in answers[t] for a in c["top2"]]
        print(f"  {t}: {sum(g >= 0.5 for g in gaps)}/{len(gaps)} positions decided")
    return {**spec, "files": files, "answers": answers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("archs", nargs="*", default=["llama", "qwen3", "qwen2", "gemma3"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stdev", type=float, default=0.5)
    ap.add_argument("--port", type=int, default=18491)
    ap.add_argument("--vocab", action="store_true", help="also record the test vocabulary")
    ap.add_argument("--tag", default="", help="a variant's name: tests/data/archs/ARCH+TAG.json")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=TYPE:VALUE",
                    help="change a metadata key of the template (with --tag)")  # fmt: skip
    ap.add_argument("--ctx", type=int, default=256, help="llama-server's context size")
    ap.add_argument("--prompt-lens", default=",".join(map(str, PROMPT_LENS)))
    ap.add_argument("--variants", default="dense,moe", help="which templates to record")
    ap.add_argument("--types", default=",".join(TYPES), help="quantized files besides F32")
    ap.add_argument(
        "--negative-a",
        action="store_true",
        help="draw Mamba's ssm_a as -|x| (jamba's per-channel A grows otherwise)",
    )
    args = ap.parse_args()
    global NEGATIVE_A
    NEGATIVE_A = args.negative_a
    if args.set and not args.tag:
        ap.error("--set needs --tag (the variant's name)")
    lens = tuple(int(n) for n in args.prompt_lens.split(","))
    types = tuple(t for t in args.types.split(",") if t)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for arch in args.archs:
            tdir = work / "tmpl"
            tdir.mkdir(exist_ok=True)
            subprocess.run([str(PEER / "test-llama-archs"), "-o", str(tdir), "-a", f"^{arch}$",
                            "-s", str(args.seed), "-d", str(args.stdev)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            variants = {}
            for v in ("dense", "moe"):
                tmpl = tdir / f"{arch}-{v}.gguf"
                if tmpl.exists() and v in args.variants.split(","):
                    print(f"{arch} ({v})")
                    try:
                        variants[v] = record_variant(arch, tmpl, work, args.seed, args.stdev,
                                                     args.port, args.set, args.ctx, lens,
                                                     types)  # fmt: skip
                    except Exception as e:  # one architecture's failure does not stop the rest
                        print(f"  {arch} ({v}) not recorded: {type(e).__name__}: {e}")
                    tmpl.unlink()
            if not variants:
                continue
            rec = {"arch": arch, "peer": "llama.cpp from the llama-cpp-python 0.3.36 sdist",
                   "n_predict": N_PREDICT, "n_ctx": args.ctx, "variants": variants}  # fmt: skip
            name = f"{arch}+{args.tag}" if args.tag else arch
            if args.tag:
                rec["tag"], rec["overrides"] = args.tag, args.set
            (OUT / f"{name}.json").write_text(json.dumps(rec, separators=(",", ":")) + "\n")
            print(f"wrote {OUT / f'{name}.json'}")
        if args.vocab:
            first = next(work.glob("*-F32.gguf"))
            (OUT / "test_vocab.json").write_text(
                json.dumps(vocab_cases(first, args.port), indent=1, ensure_ascii=False) + "\n"
            )


if __name__ == "__main__":
    main()
