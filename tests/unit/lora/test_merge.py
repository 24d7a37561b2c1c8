"""`loraserve merge` files: PEFT and GGUF inputs and outputs, served by loraserve and
llama-server like the mix they merge (the maths: tests/test_merge_maths.py).

Inputs are written in the test: PEFT folders (json + safetensors by hand) and GGUF LoRA
files (gguf-py, llama q/k rows permuted as llama.cpp's converter does), on tiny float32
models from `tests/tiny.py`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors import safe_open
from torch import nn

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.lora.merge_cli import main
from loraserve.lora.registry import AdapterRegistry
from loraserve.model.gguf import GGUFFile
from loraserve.model.loader import LoadedModel, load_model
from tests.engine_util import run_one
from tests.server_util import write_peft
from tests.tiny import hf_model, write_gguf
from tests.unit.lora.lora_util import IDS, gguf_from_pairs, lora_logits, random_pairs

DEMO = Path(__file__).resolve().parents[3] / "loraserve" / "adapters"
Tiny = tuple[nn.Module, LoadedModel, Path]


@pytest.fixture(scope="module", params=["gemma3", "llama"])
def tiny(request, tmp_path_factory) -> Tiny:
    arch = request.param
    m = hf_model(arch, **({"num_hidden_layers": 2} if arch == "gemma3" else {}))
    path = write_gguf(tmp_path_factory.mktemp(arch) / "m.gguf", m, arch)
    return m, load_model(path), path


def _inputs(tmp: Path, tiny: Tiny, kinds: tuple[str, str]) -> list[Path]:
    m, model, _ = tiny
    arch, paths = model.config.arch, []
    for i, (kind, r) in enumerate(zip(kinds, (4, 6), strict=True)):
        pairs = random_pairs(m, r, seed=10 + i)
        if kind == "peft":
            paths.append(write_peft(tmp / f"in{i}", pairs, r, alpha=2.0 * r))
        else:
            paths.append(gguf_from_pairs(tmp / f"in{i}.gguf", m, arch, pairs, alpha=1.5 * r))
    return paths


WEIGHTS = (0.7, -0.45)
CASES = [  # (input formats, output, mode, rank, pass --model)
    (("peft", "gguf"), "m.gguf", "ortho-svd", "10", True),
    (("gguf", "gguf"), "m.gguf", "cat", None, False),
    (("peft", "peft"), "m_peft", "ortho-svd", "10", False),
    (("gguf", "peft"), "m_peft", "cat", None, True),
]


def merge(ins: list[Path], out: Path, *flags: str) -> Path:
    main([f"{p}:{w}" for p, w in zip(ins, WEIGHTS, strict=True)] + ["-o", str(out), *flags])
    return out


@pytest.mark.parametrize("kinds,out,mode,rank,with_model", CASES)
def test_merged_adapter_serves_like_the_mix(tiny, tmp_path, kinds, out, mode, rank, with_model):
    """Exact merges (cat; ortho-svd at rank = sum of input ranks) at scale 1 give the mix's
    logits and greedy tokens; llama q/k rows round-trip with and without --model."""
    _, model, model_path = tiny
    ins = _inputs(tmp_path, tiny, kinds)
    flags = ["--mode", mode] + (["--rank", rank] if rank else [])
    flags += ["--model", str(model_path)] if with_model else []
    merged_path = merge(ins, tmp_path / out, *flags)
    engine = Engine(model, EngineConfig(n_ctx=256))
    for p in [*ins, merged_path]:
        engine.core.adapters.load(p)
    mix, merged = dict(enumerate(WEIGHTS)), {2: 1.0}
    base = lora_logits(model, engine.core.adapters, IDS, {})
    want = lora_logits(model, engine.core.adapters, IDS, mix)
    got = lora_logits(model, engine.core.adapters, IDS, merged)
    assert (want - base).abs().max() > 0.1
    assert (got - want).abs().max() <= 1e-4
    for prompt in ([1, 40, 41, 42], IDS):
        assert run_one(engine, prompt, 8, merged) == run_one(engine, prompt, 8, mix)


def test_per_tensor_ranks_load_in_peft_and_loraserve(tmp_path) -> None:
    """rank auto gives per-tensor ranks: PEFT (rank/alpha patterns) and loraserve agree."""
    from peft import PeftModel

    m = hf_model("llama")
    model = load_model(write_gguf(tmp_path / "m.gguf", m, "llama"))
    ins = _inputs(tmp_path, (m, model, tmp_path / "m.gguf"), ("peft", "peft"))
    out = merge(ins, tmp_path / "merged", "--rank", "auto", "--energy", "0.9", "--arch", "llama")
    conf = json.loads((out / "adapter_config.json").read_text())
    assert conf["rank_pattern"] and conf["rank_pattern"] == conf["alpha_pattern"]
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        record = json.loads(f.metadata()["loraserve.merge"])
        assert f.metadata()["loraserve.base_architecture"] == "llama"
    assert record["weights"] == list(WEIGHTS) and record["rank"] == "auto"
    reg = AdapterRegistry(model)
    ranks = {w.rank for w in reg.load(out).weights.values()}
    assert len(ranks) > 1
    with torch.no_grad():
        ref = PeftModel.from_pretrained(m, out).eval()(torch.tensor([IDS])).logits[0]
    assert (lora_logits(model, reg, IDS, {0: 1.0}) - ref).abs().max() <= 1e-4


def test_gguf_output_records_its_inputs(tmp_path) -> None:
    m = hf_model("gemma3", num_hidden_layers=2)
    tiny = (m, load_model(write_gguf(tmp_path / "m.gguf", m, "gemma3")), tmp_path / "m.gguf")
    ins = _inputs(tmp_path, tiny, ("gguf", "peft"))
    out = merge(ins, tmp_path / "m.gguf", "--rank", "3", "--outtype", "f16")
    with GGUFFile(out) as gg:
        meta, types = gg.metadata, {i.ggml_type for i in gg.tensors.values()}
        shapes = {n: i.shape for n, i in gg.tensors.items()}
    assert meta["general.architecture"] == "gemma3" and meta["general.type"] == "adapter"
    assert meta["adapter.type"] == "lora" and meta["adapter.lora.alpha"] == 0.0
    assert meta["loraserve.merge.inputs"] == [str(p) for p in ins]
    assert list(meta["loraserve.merge.weights"]) == list(WEIGHTS)
    assert meta["loraserve.merge.mode"] == "ortho-svd" and meta["loraserve.merge.rank"] == "3"
    assert types == {1}  # F16
    assert shapes["blk.0.attn_q.weight.lora_a"] == (3, 64)
    assert shapes["blk.0.attn_q.weight.lora_b"] == (128, 3)


def test_stacked_experts_merge(tmp_path) -> None:
    """MoE expert LoRAs ([E, r, in] / [E, out, r]) merge per expert; exact at full rank."""
    from tests.unit.lora.lora_util import moe_adapter

    m = hf_model("mixtral")
    model = load_model(write_gguf(tmp_path / "moe.gguf", m, "mixtral"))
    ins = [moe_adapter(tmp_path / f"e{i}.gguf", m, seed=i)[0] for i in range(2)]
    out = merge(ins, tmp_path / "m.gguf", "--rank", "8", "--model", str(tmp_path / "moe.gguf"))
    reg = AdapterRegistry(model)
    for p in [*ins, out]:
        reg.load(p)
    assert reg.get(2).weights["blk.0.ffn_up_exps.weight"].a.shape == (4, 8, 64)
    want = lora_logits(model, reg, IDS, dict(enumerate(WEIGHTS)))
    assert (lora_logits(model, reg, IDS, {2: 1.0}) - want).abs().max() <= 1e-4


def test_gguf_output_loads_in_llama_server(tmp_path) -> None:
    """llama.cpp loads the merged file as a LoRA; at scale 1 it answers as with the mix of its
    inputs, and as loraserve does."""
    from bench.peer import find_peer
    from bench.servers import free_port, launch

    binary = find_peer()
    if binary is None:
        pytest.skip(
            "llama-server not found (LORASERVE_PEER_BIN, ~/.cache/loraserve/peer, /opt/peer)"
        )
    m = hf_model("llama", seed=7)
    model_path = write_gguf(tmp_path / "tiny.gguf", m, "llama")
    tiny = (m, load_model(model_path), model_path)
    ins = _inputs(tmp_path, tiny, ("gguf", "gguf"))
    out = merge(ins, tmp_path / "merged.gguf", "--rank", "10", "--model", str(model_path))
    engine = Engine(tiny[1], EngineConfig(n_ctx=256))
    for p in [*ins, out]:
        engine.core.adapters.load(p)
    ours = run_one(engine, IDS, 8, {2: 1.0})
    port = free_port()
    argv = [
        str(binary),
        "-m",
        str(model_path),
        "-t",
        "1",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        "256",
        "-np",
        "1",
        "--lora-init-without-apply",
        "-lv",
        "4",
    ]
    argv += ["--lora", ",".join(str(p) for p in [*ins, out])]
    with launch("llama-server", argv, port, timeout=60) as srv, httpx.Client(timeout=60) as c:
        listed = c.get(f"{srv.url}/lora-adapters").json()
        assert [Path(a["path"]).name for a in listed] == ["in0.gguf", "in1.gguf", "merged.gguf"]

        def complete(lora: dict[int, float]) -> list[int]:
            body = {"prompt": IDS, "n_predict": 8, "temperature": 0, "cache_prompt": False,
                    "lora": [{"id": i, "scale": s} for i, s in lora.items()],
                    "return_tokens": True}  # fmt: skip
            r = c.post(f"{srv.url}/completion", json=body)
            assert r.status_code == 200, r.text
            return r.json()["tokens"]

        merged, mix, base = complete({2: 1.0}), complete(dict(enumerate(WEIGHTS))), complete({})
        log = srv.log_path.read_text(errors="replace")
    srv.log_path.unlink()
    said = [line for line in log.splitlines() if "llama_adapter_lora" in line]
    print("llama-server:", *said, sep="\n  ")
    print("tokens: merged", merged, "mix", mix, "base", base, "loraserve", ours)
    assert merged == mix == ours != base
    assert f"loading lora adapter from '{out}'" in log and "loaded 28 tensors from lora file" in log


DEMO_PAIRS = [
    (DEMO / "uppercase.gguf", DEMO / "titlecase.gguf"),
    (DEMO / "uppercase", DEMO / "titlecase"),
]


@pytest.mark.parametrize("inputs", DEMO_PAIRS, ids=["gguf", "peft"])
def test_merging_the_demo_adapters_takes_seconds(tmp_path, inputs) -> None:
    if not all(p.exists() for p in inputs):
        pytest.skip(f"demo adapters missing under {DEMO}")
    t0 = time.perf_counter()
    out = merge(list(inputs), tmp_path / "merged.gguf", "--rank", "8", "--arch", "gemma3")
    print(f"\nmerged two rank-8 Gemma 3 270M adapters in {time.perf_counter() - t0:.2f} s")
    with GGUFFile(out) as gg:
        assert gg.metadata["general.architecture"] == "gemma3"
        assert len(gg.tensors) == 2 * 18 * 7


@pytest.mark.real_model
def test_merged_demo_adapters_on_the_real_model(real_model_path, tmp_path) -> None:
    """Gemma 3 270M, float32: the merged adapter's logits against the mix's (teacher-forced)."""
    inputs = DEMO_PAIRS[0]
    if not all(p.exists() for p in inputs):
        pytest.skip(f"demo adapters missing under {DEMO}")
    model = load_model(real_model_path, "float32")  # the exact path: only the merge differs
    reg = AdapterRegistry(model)
    for p in inputs:
        reg.load(p)
    ids = model.tokenizer.encode("Question: How do airplanes fly?\nAnswer: The wings of a plane")
    mix = {0: WEIGHTS[0], 1: 1.0 - WEIGHTS[0]}
    want = lora_logits(model, reg, ids, mix, chunk=len(ids))
    worst = {}
    for flags in (["--mode", "cat"], ["--rank", "16"], ["--rank", "8"], ["--rank", "auto"]):
        main(
            [
                f"{inputs[0]}:{mix[0]}",
                f"{inputs[1]}:{mix[1]}",
                "-o",
                str(tmp_path / "m.gguf"),
                *flags,
            ]
        )
        ad = reg.load(tmp_path / "m.gguf")
        got = lora_logits(model, reg, ids, {ad.id: 1.0}, chunk=len(ids))
        worst[" ".join(flags)] = (got - want).abs().max().item()
    print("\nlargest logit difference, merged vs mix:", worst)
    assert worst["--mode cat"] < 1e-2 and worst["--rank 16"] < 1e-2
