"""Every architecture against llama-server, on tiny random models of llama.cpp's own test shapes.

tests/data/archs/<arch>.json (scripts/record_arch_cases.py) holds each model's spec (metadata and
tensor table from `test-llama-archs`, seed, stdev), the sha256 of the files llama.cpp ran and
llama-server's greedy tokens with top-2 log-probabilities; <arch>+<tag>.json the same for a
variant of the template's metadata that llama.cpp's generator does not write (a partial rope,
YaRN, long rope factors: its ``overrides``), answered at llama-server's context ``n_ctx``. Here:

- the F32 file is rebuilt by loraserve's GGUF writer (same sha256), and Q8_0 / Q4_K_M by
  loraserve's quantizer with llama-quantize's tensor types (same bytes, sha256 of the tensors);
- teacher-forced (each position asked with llama-server's own prefix), loraserve's greedy token
  equals llama-server's wherever llama-server's top-1/top-2 log-probability gap is >= 0.5, on
  every such position in F32, Q8_0 and Q4_K_M, with the KV cache in fp16 as llama-server's
  default (`-ctk/-ctv f16`; with an fp32 cache the quantized logits differed by a median 0.03
  in log-probability, enough to flip ~1 in 20 decided positions of these stdev-0.5 models:
  ggml's activation rounding and its f16 attention only matter together);
- the same requests give bit-identical probabilities alone, batched together, and resumed from
  the prefix cache, in each of F32, Q8_0 and Q4_K_M;
- with a random adapter mix, the answers equal the adapter merged into the float weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.engine.runner import ModelRunner
from loraserve.lora.adapter_write import write_gguf_lora
from loraserve.model.gguf_write import write_gguf
from loraserve.model.tokenizer import Tokenizer
from loraserve.model.weights import permute_qk
from tests.arch_models import tensor_values, typed_metadata
from tests.engine_util import ask, run_and_drain
from tests.unit.model.archs_util import (
    GAP,
    KV,
    PROBS,
    RECORDS,
    VARIANTS,
    VOCAB,
    case_id,
    forced_logits,
    load,
    model_file,
    random_adapter,
)

TYPES = ("F32", "Q8_0", "Q4_K_M")
# every recorded (model, variant, file type): a tagged record may hold F32 answers only
CASES = [(a, v, t) for a, v in VARIANTS for t in TYPES if t in RECORDS[a]["variants"][v]["answers"]]
# records of long prompts (llama4's chunks of 8,192 positions) check the teacher-forced answers
# alone: the engine and adapter checks run on the short ones
LONG = {a for a, r in RECORDS.items() if int(r.get("n_ctx", 256)) > 256 and "long" in a}
SHORT = [(a, v) for a, v in VARIANTS if a not in LONG]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("archs")


def answers(eng: Engine, prefixes: list[list[int]], **kw: Any) -> list[tuple[int, Any]]:
    """Each prefix's greedy next token and its top-2 probabilities, all submitted at once."""
    evs = run_and_drain(eng, [ask(p, 1, sampling=PROBS, **kw) for p in prefixes])
    for e in evs:
        assert e[-1].error is None, e[-1].error
    return [(e[0].token, e[0].probs) for e in evs]


@pytest.mark.parametrize("arch,variant,qtype", CASES, ids=map(case_id, CASES))
def test_greedy_equals_llama_server(tmp: Path, arch: str, variant: str, qtype: str) -> None:
    rec = RECORDS[arch]["variants"][variant]
    model = load(model_file(tmp, arch, variant, qtype), arch)
    cases = rec["answers"][qtype]
    ours = forced_logits(ModelRunner(model.decoder, 16, KV), cases).argmax(-1)
    ref = [
        (t, top2[0][1] - top2[1][1])
        for c in cases
        for t, top2 in zip(c["tokens"], c["top2"], strict=True)
    ]
    decided = [(t, int(o)) for (t, gap), o in zip(ref, ours, strict=True) if gap >= GAP]
    wrong = [(t, o) for t, o in decided if t != o]
    assert len(decided) >= len(ref) // 3, "too few decided positions to mean anything"
    assert not wrong, f"{len(wrong)}/{len(decided)} decided positions differ: {wrong}"
    if arch in LONG:
        return  # the engine checks below: on every short record's F32, Q8_0 and Q4_K_M file
    # through the engine: bit-identical alone (one slot, no cache), batched, and resumed from
    # the prefix cache, and the greedy token the teacher-forced pass chose
    prefixes = [c["prompt"] + c["tokens"][:i] for c in cases for i in (0, 7, 15, 23)]
    picks = [len(c["tokens"]) * j + i for j, c in enumerate(cases) for i in (0, 7, 15, 23)]
    ctx = int(RECORDS[arch].get("n_ctx", 256))  # per slot as llama-server's (phi3's rope factors)
    eng = Engine(model, EngineConfig(n_slots=16, n_ctx=16 * ctx, block_size=4, kv_dtype=KV))
    batched = answers(eng, prefixes)
    assert [t for t, _ in batched] == [int(ours[i]) for i in picks]
    alone_eng = Engine(model, EngineConfig(n_slots=1, n_ctx=ctx, block_size=4, kv_dtype=KV))
    assert [answers(alone_eng, [p], cache_prompt=False)[0] for p in prefixes] == batched
    evs = run_and_drain(eng, [ask(p, 1, sampling=PROBS) for p in prefixes])
    assert sum(e[-1].n_cached for e in evs) > 0, "nothing resumed from the prefix cache"
    assert [(e[0].token, e[0].probs) for e in evs] == batched, "resumed differs from batched"


@pytest.mark.parametrize("arch,variant", SHORT, ids=map(case_id, SHORT))
def test_adapter_mix_equals_merged_weights(tmp: Path, arch: str, variant: str) -> None:
    rec = RECORDS[arch]["variants"][variant]
    path = model_file(tmp, arch, variant, "F32")
    model = load(path, arch)
    name_arch = RECORDS[arch]["arch"]  # arch is the record's key: <arch> or <arch>+<tag>
    cfg = model.config
    heads = (cfg.n_heads, cfg.n_kv_heads)
    p1, p2 = random_adapter(rec, 1), random_adapter(rec, 2)
    write_gguf_lora(tmp / f"{arch}-{variant}-a1.gguf", name_arch, p1, qk_heads=heads)
    write_gguf_lora(tmp / f"{arch}-{variant}-a2.gguf", name_arch, p2, qk_heads=heads)
    mix = {0: 0.8, 1: -0.5}
    values = tensor_values(rec)
    for scale, pairs in ((0.8, p1), (-0.5, p2)):
        for name, (a, b) in pairs.items():
            # the file's B, as llama.cpp applies it to the file's W (write_gguf_lora permutes
            # q/k rows for a llama base, as llama.cpp's converter does; others as given)
            if name_arch == "llama" and name.endswith((".attn_q.weight", ".attn_k.weight")):
                b = permute_qk(b, heads[0] if ".attn_q." in name else heads[1])
            delta = b.double() @ a.double()  # [out, in], or [E, out, in] per expert
            values[name] = values[name] + scale * delta.float().numpy().reshape(values[name].shape)
    merged_path = write_gguf(tmp / f"{arch}-{variant}-merged.gguf", typed_metadata(rec["metadata"]),
                             values)  # fmt: skip
    merged = load(merged_path, arch)
    ctx = int(RECORDS[arch].get("n_ctx", 256))  # per slot, as the merged model's (`load`)
    eng = Engine(model, EngineConfig(n_slots=4, n_ctx=4 * ctx, block_size=16))
    eng.load_adapter(tmp / f"{arch}-{variant}-a1.gguf", 0.0).result()
    eng.load_adapter(tmp / f"{arch}-{variant}-a2.gguf", 0.0).result()
    cases = rec["answers"]["F32"]
    got = forced_logits(eng.core.runner, cases, mix).log_softmax(-1)
    want = forced_logits(ModelRunner(merged.decoder, 16, torch.float32), cases).log_softmax(-1)
    base = forced_logits(ModelRunner(model.decoder, 16, torch.float32), cases).log_softmax(-1)
    assert (base - want).abs().max() > 0.01, "the adapters change nothing: no test"
    assert (got - want).abs().max() < 2e-3
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


@pytest.mark.skipif(VOCAB is None, reason="no recorded test vocabulary")
def test_test_vocabulary_equals_llama_server() -> None:
    names = [f"tok_{i}" for i in range(128)]
    tok = Tokenizer.from_gguf_metadata(
        {"tokenizer.ggml.model": "test", "tokenizer.ggml.tokens": names}
    )
    for text, ids in VOCAB["tokenize"]:
        assert tok.encode(text) == ids, text
    for ids, text in VOCAB["detokenize"]:
        assert tok.decode(ids) == text


def test_decided_positions_recorded() -> None:
    """The recorded answers decide most positions (stdev 0.5), so the comparison means something."""
    for arch, rec in RECORDS.items():
        for variant, v in rec["variants"].items():
            gaps = np.array([a[0][1] - a[1][1] for c in v["answers"]["F32"] for a in c["top2"]])
            assert (gaps >= GAP).mean() > 0.4, (arch, variant)
