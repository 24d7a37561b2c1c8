"""LoRA maths: batched adapters in loraserve's decoder equal PEFT and hand-merged weights.

Tiny float32 transformers models are the oracle; adapters are written in the test as PEFT
folders (random non-zero A and B) and as llama.cpp GGUF LoRA files (q/k rows of ``lora_b``
permuted as llama.cpp's ``convert_lora_to_gguf.py`` does for llama).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.lora.registry import AdapterRegistry
from tests.tiny import hf_logits
from tests.unit.lora.lora_util import (
    IDS,
    TARGETS,
    Tiny,
    close,
    gguf_from_peft,
    lora_logits,
    merged,
    merged_moe,
    moe_adapter,
    peft_adapter,
    tiny,
)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return tiny(tmp_path_factory, "gemma3")


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return tiny(tmp_path_factory, "mixtral")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_single_adapter_equals_peft(request, tmp_path, arch: str) -> None:
    m, model = request.getfixturevalue(arch)
    targets = TARGETS + (["lm_head"] if arch == "llama" else [])
    folder, pm = peft_adapter(tmp_path / "a", m, target_modules=targets)
    reg = AdapterRegistry(model)
    reg.load(folder)
    with torch.no_grad():
        ref = pm(torch.tensor([IDS])).logits[0]
    close(lora_logits(model, reg, IDS, {0: 1.0}), ref, hf_logits(m, IDS))


def test_rslora_and_patterns_equal_peft(llama, tmp_path) -> None:
    m, model = llama
    folder, pm = peft_adapter(
        tmp_path / "a", m, r=4, alpha=6.0, use_rslora=True,
        rank_pattern={"q_proj": 8}, alpha_pattern={r"layers\.1\.mlp\.down_proj": 3.0},
    )  # fmt: skip
    reg = AdapterRegistry(model)
    ad = reg.load(folder)
    assert ad.weights["blk.0.attn_q.weight"].rank == 8
    assert ad.weights["blk.1.ffn_down.weight"].factor == pytest.approx(3.0 / 2.0)
    with torch.no_grad():
        ref = pm(torch.tensor([IDS])).logits[0]
    close(lora_logits(model, reg, IDS, {0: 1.0}), ref, hf_logits(m, IDS))


def test_weighted_mix_equals_merged_weights(llama, tmp_path) -> None:
    m, model = llama
    reg = AdapterRegistry(model)
    folders = [peft_adapter(tmp_path / f"a{i}", m, seed=i, r=2 + 2 * i)[0] for i in range(3)]
    for f in folders:
        reg.load(f)
    mix = {0: 0.7, 1: -1.3, 2: 0.4}
    ref = hf_logits(merged(m, [(folders[i], s) for i, s in mix.items()]), IDS)
    close(lora_logits(model, reg, IDS, mix), ref, hf_logits(m, IDS))
    ref = hf_logits(merged(m, [(folders[1], -2.0)]), IDS)
    close(lora_logits(model, reg, IDS, {1: -2.0}), ref)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_gguf_form_equals_peft_form(request, tmp_path, arch: str) -> None:
    m, model = request.getfixturevalue(arch)
    folder, _ = peft_adapter(tmp_path / "a", m, alpha=12.0)
    reg = AdapterRegistry(model)
    peft_ad = reg.load(folder)
    gguf_ad = reg.load(gguf_from_peft(tmp_path / "a.gguf", folder, m, arch))
    assert gguf_ad.name == "a-2" and gguf_ad.id == 1  # the file's name, taken: suffixed
    for t, w in peft_ad.weights.items():
        assert torch.equal(gguf_ad.weights[t].b, w.b), t  # llama q/k un-permuted
    assert gguf_ad.content_id == peft_ad.content_id  # same maths, same prefix cache
    ours = lora_logits(model, reg, IDS, {1: 0.9})
    close(ours, lora_logits(model, reg, IDS, {0: 0.9}))
    close(ours, hf_logits(merged(m, [(folder, 0.9)]), IDS), hf_logits(m, IDS))


def test_moe_expert_lora_equals_merged_weights(mixtral, tmp_path) -> None:
    m, model = mixtral
    reg = AdapterRegistry(model)
    (p0, pairs0), (p1, pairs1) = (moe_adapter(tmp_path / f"{i}.gguf", m, i) for i in (0, 1))
    assert reg.load(p0).weights["blk.0.ffn_up_exps.weight"].a.shape == (4, 4, 64)
    reg.load(p1)
    ref = hf_logits(merged_moe(m, [(pairs0, 0.8), (pairs1, -0.5)]), IDS)
    close(lora_logits(model, reg, IDS, {0: 0.8, 1: -0.5}), ref, hf_logits(m, IDS))


MIXES: list[dict[int, float]] = [{}, {0: 1.0}, {0: -0.8, 1: 0.5}, {}, {1: 1.5}, {0: 1.0}]


@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_mixed_batch_rows_equal_each_sequence_alone(request, tmp_path, arch: str) -> None:
    m, model = request.getfixturevalue(arch)
    reg = AdapterRegistry(model)
    for i in range(2):
        if arch == "mixtral":
            reg.load(moe_adapter(tmp_path / f"{i}.gguf", m, i)[0])
        else:
            targets = TARGETS + ["lm_head"]
            reg.load(peft_adapter(tmp_path / f"a{i}", m, seed=i, target_modules=targets)[0])
    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, 320, size=int(n)).tolist() for n in rng.integers(3, 9, len(MIXES))]

    def run(seqs: list[list[int]], mixes: list[dict[int, float]]) -> list[torch.Tensor]:
        """Prefill every sequence but its last token in one step, then decode it in another."""
        runner = ModelRunner(
            model.decoder, block_size=4, kv_dtype=torch.float32, lora=reg.build_delta
        )
        runner.ensure_capacity(3 * len(seqs))
        prefill, decode = [], []
        for j, (s, mix) in enumerate(zip(seqs, mixes, strict=True)):
            table = [3 * j + 2, 3 * j, 3 * j + 1]
            prefill.append(BatchItem(s, 0, len(s) - 1, table, True, mix))
            decode.append(BatchItem(s, len(s) - 1, 1, table, True, mix))
        return [runner.forward(prefill), runner.forward(decode)]

    together = run(seqs, MIXES)
    for j, (s, mix) in enumerate(zip(seqs, MIXES, strict=True)):
        alone = run([s], [mix])
        for step in range(2):
            close(together[step][j], alone[step][0])
    base = run([seqs[2]], [{}])
    assert (together[1][2] - base[1][0]).abs().max() > 0.05  # the mixes matter
