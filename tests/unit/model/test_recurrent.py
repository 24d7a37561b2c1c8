"""Recurrent and hybrid architectures: the engine's answers are bit-identical whatever the
batch, the prefill chunking and the cache state, on the models llama-server answered on.

The greedy tokens themselves are checked against llama-server by tests/unit/model/test_archs.py
(the records under tests/data/archs/ of the recurrent architectures are among its cases); the
records under tests/data/archs/recurrent/ (architectures without attention or FFN projections,
whose adapter test lives here) are checked here the same way: teacher-forced, loraserve's greedy
token equals llama-server's wherever llama-server's top-1/top-2 gap is >= 0.5, in F32, Q8_0
and Q4_K_M alike. Then, on each recorded recurrent model (Q4_K_M, rebuilt from
its spec):

- answers (tokens and top-2 probabilities) alone with the cache off, batched with prefill
  chunks that end inside blocks, and resumed from the prefix cache are all the same bits, and
  a resume starts only on a block boundary whose state snapshot exists;
- hypothesis (test_hybrid_property.py): random request sequences with shared prefixes, random
  adapter mixes (per request and global switches), prefill chunk sizes and cache budgets: every
  answer equals its cache-off answer, bit for bit;
- an adapter on the recurrent layers' in/out projections equals it merged into the weights;
- a slot saved to a file and restored elsewhere resumes from the saved states (at its end, or
  a block's snapshot), bit-identical;
- n-gram speculation rolls the state back to the last accepted draft row: answers equal those
  without speculation.

All but the adapter test run again on the delta-net and Mamba-2 models in the chunked form
(`--scan-form chunked`, chunks of 6 positions: `recurrent_util.FORMS`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraserve.engine import slot_io
from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.engine.spec.config import SpecConfig
from loraserve.lora.adapter_write import write_gguf_lora
from loraserve.model.gguf_write import write_gguf
from loraserve.model.loader import load_model
from loraserve.model.recurrent.chunked import CHUNK
from tests.arch_models import tensor_values, typed_metadata
from tests.engine_util import ask, run_and_drain
from tests.unit.model.archs_util import DATA, GAP, PROBS, case_id, forced_logits
from tests.unit.model.recurrent_util import (
    CHUNK_TEST,
    FORMS,
    RECORDS,
    RECURRENT_STEMS,
    SCANNED,
    VARIANTS,
    answers,
    form_id,
    model,
    stem_adapter,
)

HERE = [
    (p.stem, v) for p in sorted(DATA.glob("recurrent/*.json")) for v in RECORDS[p.stem]["variants"]
]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recurrent")


@pytest.mark.parametrize("arch,variant", HERE, ids=map(case_id, HERE))
@pytest.mark.parametrize("qtype", ("F32", "Q8_0", "Q4_K_M"))
def test_greedy_equals_llama_server(tmp: Path, arch: str, variant: str, qtype: str) -> None:
    rec = RECORDS[arch]["variants"][variant]
    m = model(tmp, arch, variant, qtype)
    cases = rec["answers"][qtype]
    ours = forced_logits(ModelRunner(m.decoder, 16, torch.float32), cases).argmax(-1)
    ref = [(t, top2[0][1] - top2[1][1]) for c in cases
           for t, top2 in zip(c["tokens"], c["top2"], strict=True)]  # fmt: skip
    decided = [(t, int(o)) for (t, gap), o in zip(ref, ours, strict=True) if gap >= GAP]
    wrong = [(t, o) for t, o in decided if t != o]
    assert len(decided) >= len(ref) // 3, "too few decided positions to mean anything"
    assert not wrong, f"{len(wrong)}/{len(decided)} decided positions differ: {wrong}"


@pytest.mark.parametrize("arch,variant", SCANNED, ids=map(case_id, SCANNED))
@pytest.mark.parametrize("qtype", ("F32", "Q8_0", "Q4_K_M"))
def test_chunked_form_greedy_equals_llama_server(
    tmp: Path, arch: str, variant: str, qtype: str
) -> None:
    """The chunked form of the delta-net and Mamba-2 scans (chunks of 6 and of 16, the
    server's): llama-server's greedy token on every decided position, teacher-forced; in F32
    logits other than the recurrent form's bits (the form really changed) within 1e-3."""
    rec = RECORDS[arch]["variants"][variant]
    cases = rec["answers"][qtype]
    ref = [(t, top2[0][1] - top2[1][1]) for c in cases
           for t, top2 in zip(c["tokens"], c["top2"], strict=True)]  # fmt: skip
    base = forced_logits(ModelRunner(model(tmp, arch, variant, qtype).decoder, 16,
                                     torch.float32), cases)  # fmt: skip
    for chunk in (CHUNK_TEST, CHUNK):
        m = model(tmp, arch, variant, qtype, scan_chunk=chunk)
        fused, plain = m.decoder._fused(), model(tmp, arch, variant, qtype).decoder._fused()
        if arch.split("+")[0] in ("qwen35", "qwen35moe", "qwen3next"):  # decode: recurrence
            assert (fused is None) == (plain is None), "the delta-net's fused decode differs"
        else:
            assert fused is None, "Mamba-2's fused C layers run the recurrent form only"
        logits = forced_logits(ModelRunner(m.decoder, 16, torch.float32), cases)
        ours = logits.argmax(-1)
        decided = [(t, int(o)) for (t, gap), o in zip(ref, ours, strict=True) if gap >= GAP]
        wrong = [(t, o) for t, o in decided if t != o]
        assert len(decided) >= len(ref) // 3, "too few decided positions to mean anything"
        assert not wrong, f"chunk {chunk}: {len(wrong)}/{len(decided)} decided positions differ"
        if qtype == "F32":  # (quantized activations may round a value either way, or not)
            assert not torch.equal(logits, base), "the chunked form gave the recurrent bits"
            assert (logits - base).abs().max() < 1e-3


@pytest.mark.parametrize("arch,variant,chunk", FORMS, ids=map(form_id, FORMS))
def test_alone_batched_chunked_resumed_identical(
    tmp: Path, arch: str, variant: str, chunk: int
) -> None:
    m = model(tmp, arch, variant, scan_chunk=chunk)
    cases = RECORDS[arch]["variants"][variant]["answers"]["Q4_K_M"]
    prompts = [c["prompt"] + c["tokens"][:i] for c in cases[2:] for i in (0, 13)]
    asks = [ask(p, 3, sampling=PROBS) for p in prompts]
    alone = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    ref = [answers(alone, [ask(p, 3, sampling=PROBS, cache_prompt=False)])[0] for p in prompts]
    for ubatch in (7, 64):  # prefill chunks ending inside blocks, and whole prompts
        eng = Engine(m, EngineConfig(n_slots=6, n_ctx=6 * 128, block_size=4, ubatch=ubatch))
        first = answers(eng, asks)
        again = answers(eng, asks)  # the same prompts: resumed from the prefix cache
        assert [a[:2] for a in first] == [r[:2] for r in ref], f"batched (ubatch {ubatch})"
        assert [a[:2] for a in again] == [r[:2] for r in ref], f"resumed (ubatch {ubatch})"
        cached = [a[2] for a in again]
        # a resume inside a block is from a slot's checkpoint 4 tokens before a prompt's end
        tails = {len(p) - 4 for p in prompts}
        assert all(n % 4 == 0 or n in tails for n in cached), "resumed where no state is kept"
        assert sum(cached) > 0, "nothing resumed from the prefix cache"


@pytest.mark.parametrize("arch,variant", VARIANTS, ids=map(case_id, VARIANTS))
def test_adapter_on_recurrent_projections_equals_merged(tmp: Path, arch: str, variant: str) -> None:
    rec = RECORDS[arch]["variants"][variant]
    m = model(tmp, arch, variant, "F32")
    pairs = stem_adapter(rec, 3, RECURRENT_STEMS)
    assert pairs, "no recurrent projection to adapt"
    name = RECORDS[arch]["arch"]  # the record's architecture (a tagged record: arch+tag)
    write_gguf_lora(tmp / f"{arch}-rec.gguf", name, pairs, qk_heads=(m.config.n_heads,) * 2)
    values = tensor_values(rec)
    for name, (a, b) in pairs.items():
        values[name] = values[name] + 0.7 * (b.double() @ a.double()).float().numpy()
    merged = load_model(write_gguf(tmp / f"{arch}-rec-merged.gguf",
                                   typed_metadata(rec["metadata"]), values))  # fmt: skip
    eng = Engine(m, EngineConfig(n_slots=2, n_ctx=256, block_size=16))
    eng.load_adapter(tmp / f"{arch}-rec.gguf", 0.0).result()

    def forced(runner: ModelRunner, mix: dict[int, float]) -> torch.Tensor:
        c = rec["answers"]["F32"][-1]
        seq = c["prompt"] + c["tokens"][:-1]
        runner.ensure_capacity(8)
        item = BatchItem(seq, 0, len(seq), list(range(8)), True, mix, n_logits=len(seq))
        return runner.forward([item]).log_softmax(-1)

    got = forced(eng.core.runner, {0: 0.7})
    want = forced(ModelRunner(merged.decoder, 16, torch.float32), {})
    base = forced(ModelRunner(m.decoder, 16, torch.float32), {})
    assert (base - want).abs().max() > 0.01, "the adapter changes nothing: no test"
    assert (got - want).abs().max() < 2e-3


@pytest.mark.parametrize("arch,variant,chunk", FORMS, ids=map(form_id, FORMS))
def test_restored_slot_resumes_exact_state(tmp: Path, arch: str, variant: str, chunk: int) -> None:
    """A slot saved to a file and restored into another engine resumes from the states saved
    with its blocks: the same bits as the answer computed from scratch."""
    m = model(tmp, arch, variant, scan_chunk=chunk)
    case = RECORDS[arch]["variants"][variant]["answers"]["Q4_K_M"][-1]
    prompt, more = case["prompt"], case["tokens"][:6]
    cfg = EngineConfig(n_slots=1, n_ctx=128, block_size=4)
    first = Engine(m, cfg)
    answers(first, [ask(prompt, 3, sampling=PROBS)])
    image = slot_io.capture(first.core.scheduler, first.core.runner, 0)
    assert image is not None and image.states, "no state saved with the slot"
    cfg_m = m.config  # no KV held (in the pool or the file) where a layer does not attend
    attends = [k == "attn" or k.startswith("attn+") for k in cfg_m.layer_kinds]
    assert [k.shape[1] for k, _ in first.core.runner.kv] == [
        cfg_m.n_kv_heads if a else 0 for a in attends
    ]
    assert [k.shape[1] for k, _ in image.kv] == [cfg_m.n_kv_heads if a else 0 for a in attends]
    fp = slot_io.fingerprint(m)
    slot_io.write(tmp / f"{arch}.slot", image, fp)
    second = Engine(m, cfg)
    loaded = slot_io.read(tmp / f"{arch}.slot", fp, 128)
    assert slot_io.install(second.core.scheduler, second.core.runner, 0, loaded) == len(
        image.tokens
    )
    longer = image.tokens + more
    (got,) = answers(second, [ask(longer, 3, sampling=PROBS)])
    alone = Engine(m, cfg)
    (want,) = answers(alone, [ask(longer, 3, sampling=PROBS, cache_prompt=False)])
    assert got[2] == len(image.tokens), "not resumed from the state at the restored slot's end"
    assert got[:2] == want[:2]
    # a file without that state (only the blocks' snapshots): a block boundary
    bare = slot_io.SlotImage(loaded.tokens, loaded.cache_key, loaded.kv, loaded.states)
    third = Engine(m, cfg)
    slot_io.install(third.core.scheduler, third.core.runner, 0, bare)
    (got,) = answers(third, [ask(longer, 3, sampling=PROBS)])
    assert got[2] > 0 and got[2] % 4 == 0, "nothing resumed from the restored slot"
    assert got[:2] == want[:2]
    j, st = next(iter(loaded.states.items()))  # a block's snapshot (-cms: not every block's)
    bad = slot_io.SlotImage(loaded.tokens, loaded.cache_key, loaded.kv,
                            {j: {i: t[:1] for i, t in st.items()}})  # fmt: skip
    with pytest.raises(slot_io.SlotFileError, match="recurrent state"):
        slot_io.install(second.core.scheduler, second.core.runner, 0, bad)


@pytest.mark.parametrize("arch,variant,chunk", FORMS, ids=map(form_id, FORMS))
def test_speculation_rolls_state_back(tmp: Path, arch: str, variant: str, chunk: int) -> None:
    """n-gram speculation: rejected draft rows are rolled back to the state after the last
    accepted one, so the answers equal those without speculation, bit for bit."""
    m = model(tmp, arch, variant, scan_chunk=chunk)
    prompts = [[5, 6, 7, 8, 9] * 5, [3, 1, 4, 1, 5, 9, 2, 6] * 3]
    spec = SpecConfig(types=("ngram-simple",), ngram_simple_size_n=1, ngram_simple_size_m=3)
    on = Engine(m, EngineConfig(n_slots=2, n_ctx=256, block_size=4, spec=spec))
    off = Engine(m, EngineConfig(n_slots=2, n_ctx=256, block_size=4))
    evs = run_and_drain(on, [ask(p, 12, sampling=PROBS) for p in prompts])
    want = answers(off, [ask(p, 12, sampling=PROBS) for p in prompts])
    got = [[(e.token, e.probs) for e in ev if e.token is not None] for ev in evs]
    assert got == [list(zip(w[0], w[1], strict=True)) for w in want]
    drafted = sum(ev[-1].timings.draft_n for ev in evs)
    accepted = sum(ev[-1].timings.draft_n_accepted for ev in evs)
    assert drafted > accepted, "no draft row rejected: the rollback was not exercised"


def test_scan_form_flag_picks_the_form(tmp: Path) -> None:
    """`--scan-form chunked` loads the model with chunks of `chunked.CHUNK` (larger carried
    records in the state store's shapes); the default loads the recurrent form."""
    from loraserve.model.recurrent import state_shapes
    from loraserve.server.config.args import parse_server_args
    from loraserve.server.startup import load_from_config

    path = model(tmp, "qwen35", "dense").path
    plain = load_from_config(parse_server_args(["-m", str(path)]))
    chunked = load_from_config(parse_server_args(["-m", str(path), "--scan-form", "chunked"]))
    assert (plain.config.scan_chunk, chunked.config.scan_chunk) == (0, CHUNK)
    small, big = state_shapes(plain.config), state_shapes(chunked.config)
    assert small.keys() == big.keys() and small
    assert all(big[i][0] > small[i][0] for i in small)
