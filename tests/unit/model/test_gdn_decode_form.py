"""`--scan-form chunked` runs the delta-net's chunked form for prompts and its recurrent form
for decode (issue 28, item 1), on the recorded tiny models llama-server answered on.

- Decode rows are the recurrence's bits: after a one-token prompt the two forms' states are
  the same bits (nothing to reorder yet), so every later decode row of the chunked form must
  equal the recurrent form's engine bit for bit; running those rows through the chunked form
  instead (the form before, forced here) does not.
- A state a decode made is resumed as any other: a chat's next turn (its prompt extends the
  last one's answer) resumed from the cache, past the last prompt's end, answers the bits of
  the same prompt computed from scratch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.model.recurrent import chunked
from tests.engine_util import ask
from tests.unit.model.archs_util import PROBS, case_id
from tests.unit.model.recurrent_util import CHUNK_TEST, RECORDS, SCANNED, answers, model

DELTA = [(a, v) for a, v in SCANNED if a.split("+")[0] in ("qwen35", "qwen35moe", "qwen3next")]
N_GEN = 12


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gdn_decode")


def _decode(tmp: Path, arch: str, variant: str, chunk: int) -> tuple[list, list, int]:
    m = model(tmp, arch, variant, scan_chunk=chunk)
    prompt = RECORDS[arch]["variants"][variant]["answers"]["Q4_K_M"][0]["prompt"][:1]
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=64, block_size=4))
    return answers(eng, [ask(prompt, N_GEN, sampling=PROBS, cache_prompt=False)])[0]


@pytest.mark.parametrize("arch,variant", DELTA, ids=map(case_id, DELTA))
def test_decode_rows_are_the_recurrence(
    tmp: Path, arch: str, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _decode(tmp, arch, variant, 0)  # the recurrent form throughout
    got = _decode(tmp, arch, variant, CHUNK_TEST)
    assert got[0] == want[0], "the forms sampled other tokens"
    # row 0's token comes from the prompt row (chunked form); rows 1.. from decode rows
    assert got[1][1:] == want[1][1:], "a decode row of the chunked form is not the recurrence's"

    real = chunked.gdn_scan

    def chunk_rows_only(m: Any, seqs: list, *a: Any) -> None:
        for seq in seqs:
            seq.decode = False
        real(m, seqs, *a)

    monkeypatch.setattr(chunked, "gdn_scan", chunk_rows_only)
    forced = _decode(tmp, arch, variant, CHUNK_TEST)
    assert forced[1][1:] != want[1][1:], "the chunked form's decode rows gave the same bits"


@pytest.mark.parametrize("arch,variant", DELTA, ids=map(case_id, DELTA))
def test_next_turn_resumes_a_decode_made_state(tmp: Path, arch: str, variant: str) -> None:
    m = model(tmp, arch, variant, scan_chunk=CHUNK_TEST)
    cases = RECORDS[arch]["variants"][variant]["answers"]["Q4_K_M"]
    first = cases[0]["prompt"]
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    (turn1,) = answers(eng, [ask(first, N_GEN, sampling=PROBS)])
    second = first + turn1[0][:-1] + cases[1]["prompt"][:5]  # the answer as it was fed
    (got,) = answers(eng, [ask(second, 4, sampling=PROBS)])
    fresh = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    (want,) = answers(fresh, [ask(second, 4, sampling=PROBS, cache_prompt=False)])
    assert got[2] > len(first), "the next turn did not resume from a state a decode made"
    assert got[:2] == want[:2]
