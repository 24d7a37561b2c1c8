"""Recurrent layers in F32 and Q8_0 files (issue 28: "in F32, Q8_0 and Q4_K_M; alone,
batched, resumed from the cache and restored from a saved slot, bit-identical among those").

`test_recurrent.py` and `test_hybrid_slots.py` run every recorded recurrent model in Q4_K_M;
here each layer kind (Mamba-2: granitehybrid, gated delta-net: qwen35, short conv: lfm2) runs
from the F32 and the Q8_0 file llama-server answered on (rebuilt from its record, digest
checked): the answers (tokens and top-2 probabilities) of prompts alone with the cache off,
batched with prefill chunks ending inside blocks, again from the prefix cache, and a next turn
from a slot saved to a file and restored into a fresh engine (at the exact state of its end,
inside a block) are all the same bits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loraserve.engine import slot_io
from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from tests.engine_util import ask
from tests.unit.model.archs_util import PROBS
from tests.unit.model.recurrent_util import RECORDS, answers, model

KINDS = ("granitehybrid", "qwen35", "lfm2")  # Mamba-2, gated delta-net, short conv
CASES = [(a, q) for q in ("F32", "Q8_0") for a in KINDS if a in RECORDS]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("filetypes")


@pytest.mark.parametrize("arch,qtype", CASES, ids=["-".join(c) for c in CASES])
def test_alone_batched_resumed_restored_identical(tmp: Path, arch: str, qtype: str) -> None:
    m = model(tmp, arch, "dense", qtype)
    cases = RECORDS[arch]["variants"]["dense"]["answers"][qtype]
    prompts = [c["prompt"] + c["tokens"][:i] for c in cases[-2:] for i in (0, 5)]
    cfg = EngineConfig(n_slots=1, n_ctx=128, block_size=4)
    alone = Engine(m, cfg)
    ref = [answers(alone, [ask(p, 3, sampling=PROBS, cache_prompt=False)])[0] for p in prompts]
    eng = Engine(m, EngineConfig(n_slots=4, n_ctx=4 * 128, block_size=4, ubatch=7))
    asks = [ask(p, 3, sampling=PROBS) for p in prompts]
    first, again = answers(eng, asks), answers(eng, asks)
    assert [a[:2] for a in first] == [r[:2] for r in ref], "batched"
    assert [a[:2] for a in again] == [r[:2] for r in ref], "resumed from the cache"
    assert sum(a[2] for a in again) > 0, "nothing resumed from the prefix cache"

    one = Engine(m, cfg)
    ((gen, _, _),) = answers(one, [ask(prompts[0], 4, sampling=PROBS)])
    fp = slot_io.fingerprint(m)
    slot_io.write(tmp / f"{arch}-{qtype}.slot", one.save_slot(0).result(), fp)
    loaded = slot_io.read(tmp / f"{arch}-{qtype}.slot", fp, 128)
    assert loaded.live is not None, "the state at the slot's end was not saved"
    nxt = prompts[0] + gen + [13, 14, 15]
    restored = Engine(m, cfg)
    assert restored.restore_slot(0, loaded).result() == len(loaded.tokens)
    ((got, probs, cached),) = answers(restored, [ask(nxt, 3, sampling=PROBS)])
    ((want, want_probs, _),) = answers(alone, [ask(nxt, 3, sampling=PROBS, cache_prompt=False)])
    assert (got, probs) == (want, want_probs), "restored from a saved slot"
    assert cached == len(loaded.tokens), "not resumed at the restored slot's end"
    restored.core.cache.check()
