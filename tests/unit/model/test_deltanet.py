"""The gated delta-net (`recurrent.GatedDeltaNet`: qwen35, qwen35moe, qwen3next) beyond what
test_archs.py and test_recurrent.py check on every recorded recurrent architecture.

- Key heads shared by several value heads, as in every real Qwen3.5 / Qwen3-Next and not in
  `test-llama-archs`' template: tests/data/archs/deltanet/<arch>+heads.json
  (scripts/record_deltanet_heads.py: 2 key heads, 4 value heads) hold llama-server's answers;
  teacher-forced, loraserve's greedy token equals llama-server's on every position whose
  top-1/top-2 gap is >= 0.5, in F32 and Q4_K_M. The other architecture's head mapping (tiled
  instead of interleaved, or the reverse) disagrees with llama-server there: the records tell
  the two apart.
- The early qwen3next layout (q, k, v and z in one ``ssm_in`` per key head, no ``attn_qkv``):
  tests/data/archs/deltanet/qwen3next+ssm_in.json (``--legacy``), checked the same way.
- An adapter on that layout's ssm_in, ssm_ba and ssm_out equals it merged into the weights.
- Any prefill chunking (cut anywhere, not only at blocks) and any batch gives the same logits,
  bit for bit, as the sequence computed alone in one piece: the recurrence runs token by token
  in a fixed order.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.lora.adapter_write import write_gguf_lora
from loraserve.model.gguf_write import write_gguf
from loraserve.model.loader import LoadedModel, load_model
from tests.arch_models import tensor_values, typed_metadata, write_model
from tests.unit.model.archs_util import forced_logits
from tests.unit.model.deltanet_util import DATA, RECORDS, model, run_chunks, variant
from tests.unit.model.recurrent_util import stem_adapter

CASES = [(a, t) for a in RECORDS for t in ("F32", "Q4_K_M")]
GAP = 0.5


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deltanet")


def forced(m: LoadedModel, cases: list[dict[str, Any]]) -> torch.Tensor:
    """Teacher-forced logits [sum of N, V] of every position predicting llama-server's tokens."""
    return forced_logits(ModelRunner(m.decoder, 16, torch.float16), cases)  # f16 KV as llama-server


def _wrong(m: LoadedModel, cases: list[dict[str, Any]]) -> tuple[int, int]:
    """(decided positions, those where our greedy token differs from llama-server's)."""
    ours = forced(m, cases).argmax(-1).tolist()
    ref = [(t, top2[0][1] - top2[1][1]) for c in cases
           for t, top2 in zip(c["tokens"], c["top2"], strict=True)]  # fmt: skip
    decided = [(t, o) for (t, gap), o in zip(ref, ours, strict=True) if gap >= GAP]
    return len(decided), sum(t != o for t, o in decided)


@pytest.mark.parametrize("arch,qtype", CASES, ids=["-".join(c) for c in CASES])
def test_shared_key_heads_equal_llama_server(tmp: Path, arch: str, qtype: str) -> None:
    m = model(tmp, arch, qtype)
    mixers = [b.mixer for b in m.decoder.blocks if b.mixer is not None]
    assert mixers and all(x.hk < x.hv for x in mixers), "no key head shared: no test"
    cases = variant(arch)["answers"][qtype]
    n, wrong = _wrong(m, cases)
    assert n >= len(cases) * 24 // 3, "too few decided positions to mean anything"
    assert wrong == 0, f"{wrong}/{n} decided positions differ from llama-server"
    if qtype != "F32":
        return
    saved = [x.kmap for x in mixers]
    try:  # the other architecture's mapping of value heads to key heads
        for x in mixers:
            r = x.hv // x.hk
            x.kmap = torch.arange(x.hv) % x.hk if x.interleave else torch.arange(x.hv) // r
        assert _wrong(m, cases)[1] > 0, "the head mapping does not matter here: no test"
    finally:
        for x, k in zip(mixers, saved, strict=True):
            x.kmap = k


def test_any_chunking_and_batch_same_bits(tmp: Path) -> None:
    arch = "qwen35+heads"  # the layer's code is the same for the other records
    m = model(tmp, arch, "Q4_K_M")
    rng = random.Random(5)
    seqs = [c["prompt"] + c["tokens"] for c in variant(arch)["answers"]["Q4_K_M"][1:]]
    alone = [run_chunks(ModelRunner(m.decoder, 4, torch.float32), [s], [[]])[0] for s in seqs]
    for _ in range(2):  # random cuts, inside blocks too, all sequences batched
        cuts = [sorted(rng.sample(range(1, len(s)), rng.randint(1, 6))) for s in seqs]
        got = run_chunks(ModelRunner(m.decoder, 4, torch.float32), seqs, cuts)
        for g, a, c in zip(got, alone, cuts, strict=True):
            assert torch.equal(g, a), f"cut at {c}: not the bits of the sequence alone"


def test_adapter_on_legacy_ssm_in_equals_merged(tmp: Path) -> None:
    """LoRA on ssm_in (applied to the stored rows, before they are reordered), ssm_ba and
    ssm_out of an early qwen3next file equals the adapter merged into those weights."""
    arch, rec = "qwen3next+ssm_in", variant("qwen3next+ssm_in")
    m = model(tmp, arch, "F32")
    pairs = stem_adapter(rec, 7, ("ssm_in", "ssm_ba", "ssm_out"))
    assert any(".ssm_in." in n for n in pairs), "no ssm_in to adapt"
    write_gguf_lora(tmp / "legacy-lora.gguf", "qwen3next", pairs, qk_heads=(2, 2))
    values = tensor_values(rec)
    for n, (a, b) in pairs.items():
        values[n] = values[n] + 0.7 * (b.double() @ a.double()).float().numpy()
    merged = load_model(write_gguf(tmp / "legacy-merged.gguf", typed_metadata(rec["metadata"]),
                                   values))  # fmt: skip
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=256, block_size=16))
    eng.load_adapter(tmp / "legacy-lora.gguf", 0.0).result()
    c = rec["answers"]["F32"][-1]
    seq = c["prompt"] + c["tokens"][:-1]

    def logp(runner: ModelRunner, mix: dict[int, float]) -> torch.Tensor:
        runner.ensure_capacity(8)
        item = BatchItem(seq, 0, len(seq), list(range(8)), True, mix, n_logits=len(seq))
        return runner.forward([item]).log_softmax(-1)

    got = logp(eng.core.runner, {0: 0.7})
    want = logp(ModelRunner(merged.decoder, 16, torch.float32), {})
    base = logp(ModelRunner(m.decoder, 16, torch.float32), {})
    assert (base - want).abs().max() > 0.01, "the adapter changes nothing: no test"
    assert (got - want).abs().max() < 2e-3


def test_impossible_sizes_refused_with_their_name(tmp: Path) -> None:
    """No key heads (sizes that pass the tensor shape checks) is one clear error at load."""
    rec = json.loads((DATA.parent / "qwen35.json").read_text())["variants"]["dense"]
    rec = {**rec, "metadata": [m if m[0] != "qwen35.ssm.group_count" else [m[0], m[1], 0]
                               for m in rec["metadata"]]}  # fmt: skip
    rec["tensors"] = [[n, [256, s[1]] if n in ("blk.0.ssm_conv1d.weight",
                                                "blk.0.attn_qkv.weight") else s, t]
                      for n, s, t in rec["tensors"]]  # fmt: skip
    with pytest.raises(ValueError, match="delta-net sizes"):
        load_model(write_model(rec, tmp / "bad-sizes.gguf"))
