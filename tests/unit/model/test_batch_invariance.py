"""The default engine's central numerics promise, as a property: a sequence's logits are
bitwise the same alone (one prefill chunk), inside random batches of other sequences under
other adapter mixes, with random prefill chunk sizes, token-by-token decode, and resumed
from KV that another sequence computed (what a prefix-cache hit reuses). The model is a
tiny Gemma 3 whose matrices hold nine different ggml types, with two LoRA adapters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loraserve.kernels as K
from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.lora.registry import AdapterRegistry
from loraserve.model.loader import LoadedModel, load_model
from tests.tiny import gguf_tensors, hf_model, our_logits, write_gguf
from tests.unit.lora.lora_util import peft_adapter

TYPES = {
    "attn_q": Q.Q4_K, "attn_k": Q.Q5_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_1,
    "ffn_gate": Q.Q3_K, "ffn_up": Q.Q2_K, "ffn_down": Q.Q4_0, "token_embd": Q.Q8_0,
}  # fmt: skip
MIXES: list[dict[int, float]] = [{}, {0: 1.0}, {1: -0.7}, {0: 0.5, 1: 1.5}]
BS = 4  # KV block size


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[LoadedModel, AdapterRegistry]:
    tmp = tmp_path_factory.mktemp("inv")
    m = hf_model("gemma3", hidden_size=256, intermediate_size=256, seed=5)
    quant = {}
    for name in gguf_tensors(m, "gemma3"):
        stem = name.split(".")[-2]
        if stem in TYPES:
            quant[name] = TYPES[stem]
    model = load_model(write_gguf(tmp / "q.gguf", m, "gemma3", quant))
    parts = [
        p for b in model.decoder.blocks for pr in (b.qkv, b.o, b.gate_up, b.down) for p in pr.parts
    ]
    assert {p.ggml_type for p in parts} == {int(t) for t in TYPES.values()} - {
        int(Q.Q8_0)
    }  # really mixed formats, on the quantized kernels
    if K.backend() == "c":  # both layouts: rows repacked 8 to a group and the file's own
        # (Q4_1 has no packed layout: its rows stay in the file's)
        packed = {int(t) for t in TYPES.values()} - {int(Q.Q4_1), int(Q.Q8_0)}
        assert {p.ggml_type for p in parts if p.packed} == packed
        assert model.decoder.output.parts[0].packed  # the tied Q8_0 output matrix
    reg = AdapterRegistry(model)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for i in range(2):
        reg.load(peft_adapter(tmp / f"a{i}", m, seed=i, target_modules=targets)[0])
    return model, reg


class Seq:
    """One sequence's tokens, mix and block table in a shared runner."""

    def __init__(self, tokens: list[int], mix: dict[int, float], blocks: list[int]) -> None:
        self.tokens, self.mix, self.blocks, self.done = tokens, mix, blocks, 0


def run_alone(
    model: LoadedModel, reg: AdapterRegistry, s: Seq, kv: torch.dtype = torch.float32
) -> torch.Tensor:
    """Logits [len, V] at every position from one prefill chunk, alone in a fresh runner
    (KV pool of dtype ``kv``)."""
    if kv == torch.float32:
        return our_logits(model, s.tokens, len(s.tokens), s.mix, reg.build_delta)
    runner = ModelRunner(model.decoder, BS, kv, lora=reg.build_delta)
    need = -(-len(s.tokens) // BS)
    runner.ensure_capacity(need + 1)
    blocks = list(range(1, need + 1))[::-1]
    item = BatchItem(s.tokens, 0, len(s.tokens), blocks, True, s.mix, n_logits=len(s.tokens))
    return runner.forward([item])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
@pytest.mark.parametrize("kv", [torch.float32, torch.float16], ids=["kv-f32", "kv-f16"])
def test_logits_bitwise_equal_alone_batched_chunked_and_resumed(setup, kv, data) -> None:
    """kv-f16: the f16 KV pool with llama.cpp's f16 attention numerics (attention_f16.h)."""
    model, reg = setup
    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(2, 5))
    seqs = []
    for j in range(n):
        length = int(rng.integers(2, 24))
        seqs.append(Seq(rng.integers(3, 320, size=length).tolist(), MIXES[j % 4], []))
    # sequence 1 resumes from sequence 0's KV: the same first tokens and mix, its blocks
    share = min(draw(st.integers(0, 2)), len(seqs[0].tokens) // BS)  # full blocks only
    if share:
        seqs[1].mix = seqs[0].mix
        seqs[1].tokens = seqs[0].tokens[: BS * share] + seqs[1].tokens
    runner = ModelRunner(model.decoder, BS, kv, lora=reg.build_delta)
    next_block = 0
    for s in seqs:
        need = -(-len(s.tokens) // BS)
        s.blocks = list(range(next_block, next_block + need))[::-1]  # scattered tables
        next_block += need
    if share:
        seqs[1].blocks[:share] = seqs[0].blocks[:share]
        seqs[1].done = -1  # waits until sequence 0 has computed the shared blocks
    runner.ensure_capacity(next_block)
    got: dict[int, dict[int, torch.Tensor]] = {j: {} for j in range(n)}
    while any(s.done < len(s.tokens) for s in seqs):
        items, owners = [], []
        for j, s in enumerate(seqs):
            if s.done == -1:
                if seqs[0].done >= BS * share:
                    s.done = BS * share
                continue
            if s.done >= len(s.tokens) or draw(st.booleans()):
                continue
            k = draw(st.integers(1, max(1, min(7, len(s.tokens) - s.done))))
            items.append(BatchItem(s.tokens, s.done, k, s.blocks, True, s.mix))
            owners.append((j, s.done + k - 1))
            s.done += k
        if items:
            logits = runner.forward(items)
            for (j, p), row in zip(owners, logits, strict=True):
                got[j][p] = row
    for j, s in enumerate(seqs):
        ref = run_alone(model, reg, s, kv)
        for p, row in got[j].items():
            assert torch.equal(row, ref[p]), f"sequence {j} (mix {s.mix}) position {p} differs"
