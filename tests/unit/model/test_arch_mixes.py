"""Per-request adapter mixes batched on MoE architectures and latent attention (qwen3moe,
gpt-oss, deepseek2: routed experts' stacked LoRA, shared experts, the latent projections), on the
recorded tiny models of tests/data/archs: two random GGUF adapters on every projection and
expert stack, and requests under different mixes in one batch. Each request's logits are
bit-identical batched, alone, and (through the engine) resumed from the prefix cache, and equal
its own mix merged into the float weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.lora.adapter_write import write_gguf_lora
from loraserve.model.gguf_write import write_gguf
from tests.arch_models import tensor_values, typed_metadata
from tests.engine_util import ask, run_and_drain
from tests.unit.model.archs_util import PROBS, RECORDS, load, model_file, random_adapter

ARCHS = ["qwen3moe", "gpt-oss", "deepseek2"]
MIXES: list[dict[int, float]] = [{}, {0: 0.8}, {1: -0.5}, {0: 0.8, 1: -0.5}, {0: -0.3, 1: 1.2}]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arch_mixes")


def forced(runner: ModelRunner, cases: list[dict], mixes: list[dict[int, float]],
           first_block: int = 0) -> list[torch.Tensor]:  # fmt: skip
    """Teacher-forced logits [N, V] of each (case, mix) pair, all in one forward pass."""
    items, block = [], first_block
    for c, mix in zip(cases, mixes, strict=True):
        seq = c["prompt"] + c["tokens"][:-1]
        n = -(-len(seq) // runner.bs)
        items.append(BatchItem(seq, 0, len(seq), list(range(block, block + n))[::-1], True, mix,
                               n_logits=len(c["tokens"])))  # fmt: skip
        block += n
    runner.ensure_capacity(block)
    out = runner.forward(items)
    sizes = [len(c["tokens"]) for c in cases]
    return list(out.split(sizes))


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_mixes_bitwise_alone_and_equal_merged(tmp: Path, arch: str) -> None:
    variant = next(iter(RECORDS[arch]["variants"]))
    rec = RECORDS[arch]["variants"][variant]
    model = load(model_file(tmp, arch, variant, "F32"), arch)
    name_arch, cfg = RECORDS[arch]["arch"], model.config
    assert not cfg.permuted_qk  # the adapters' B rows are the base's as written
    pairs = [random_adapter(rec, 1), random_adapter(rec, 2)]
    stems = {n.split(".")[-2] for n in pairs[0]}
    assert stems & {"ffn_gate_exps", "ffn_gate_up_exps"}, "no routed experts adapted"
    assert "ffn_gate_inp" in stems, "the router not adapted"
    files = []
    for i, p in enumerate(pairs):
        files.append(write_gguf_lora(tmp / f"{arch}-a{i}.gguf", name_arch, p,
                                     qk_heads=(cfg.n_heads, cfg.n_kv_heads)))  # fmt: skip
    eng = Engine(model, EngineConfig(n_slots=16, n_ctx=16 * 256, block_size=4))
    for f in files:
        eng.load_adapter(f, 0.0).result()
    cases = rec["answers"]["F32"]
    together = [(c, m) for c in cases for m in MIXES]
    runner = eng.core.runner
    batched = forced(runner, [c for c, _ in together], [m for _, m in together])
    at = sum(-(-(len(c["prompt"]) + len(c["tokens"])) // runner.bs) for c, _ in together)
    for k in range(len(MIXES)):  # each mix alone once, each on another case
        j = (k * (len(MIXES) + 1)) % len(together)
        c, m = together[j]
        alone = forced(runner, [c], [m], first_block=at)[0]
        assert torch.equal(alone, batched[j]), f"case {j // len(MIXES)} mix {m}: batch changes it"
    values = tensor_values(rec)
    for k, mix in enumerate(MIXES):
        merged_values = dict(values)
        for i, scale in mix.items():
            for name, (a, b) in pairs[i].items():
                delta = (b.double() @ a.double()).float().numpy()
                merged_values[name] = merged_values[name] + scale * delta.reshape(
                    merged_values[name].shape
                )
        path = write_gguf(tmp / f"{arch}-merged-{k}.gguf", typed_metadata(rec["metadata"]),
                          merged_values)  # fmt: skip
        merged = load(path, arch)
        want = forced(ModelRunner(merged.decoder, 4, torch.float32), cases, [{}] * len(cases))
        for j in range(len(cases)):
            got = batched[j * len(MIXES) + k].log_softmax(-1)
            assert (got - want[j].log_softmax(-1)).abs().max() < 2e-3, (j, mix)
    # through the engine: mixed requests batched == each alone == resumed from the cache
    prefixes = [(c["prompt"] + c["tokens"][:i], MIXES[(j + i) % len(MIXES)])
                for j, c in enumerate(cases) for i in (0, 17)]  # fmt: skip
    asks = [ask(p, 1, mix=m, sampling=PROBS) for p, m in prefixes]
    got = [(e[0].token, e[0].probs) for e in run_and_drain(eng, asks)]
    alone_eng = Engine(model, EngineConfig(n_slots=1, n_ctx=256, block_size=4))
    for f in files:
        alone_eng.load_adapter(f, 0.0).result()
    for (p, m), g in zip(prefixes, got, strict=True):
        e = run_and_drain(alone_eng, [ask(p, 1, mix=m, sampling=PROBS, cache_prompt=False)])[0]
        assert (e[0].token, e[0].probs) == g, f"mix {m}: alone differs from batched"
    evs = run_and_drain(eng, asks)
    assert sum(e[-1].n_cached for e in evs) > 0, "nothing resumed from the prefix cache"
    assert [(e[0].token, e[0].probs) for e in evs] == got, "resumed differs from batched"
