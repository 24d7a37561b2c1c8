"""`--scan-form chunked` runs the delta-net's chunked form for prompts and its recurrent form
for decode (issue 28, item 1), on the recorded tiny models llama-server answered on. Every
comparison is of each decode step's logits, bit for bit.

- Decode rows are the recurrence's bits: after a one-token prompt the two forms' states are
  the same bits (nothing to reorder yet), so every later decode step of the chunked form must
  give the recurrent form's logits, in the fused C decode layers and on the per-layer Python
  path alike; running those rows through the chunked form instead (the form before, forced
  here by marking no row sampled) does not.
- A state a decode made is resumed as any other: a chat's next turn (its prompt extends the
  last one's answer) resumed from the cache, past the last prompt's end, in the fused layers,
  decodes the logits of the same prompt computed from scratch on the per-layer Python path
  (the first decode row's state derived from a record with pending rows: C and torch agree).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from loraserve.engine import step_plan
from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.kernels import deltanet as kernel
from loraserve.kernels import gdn_chunk
from loraserve.model.decoder import Decoder
from loraserve.model.recurrent import deltanet
from tests.engine_util import ask
from tests.unit.model.archs_util import PROBS, case_id
from tests.unit.model.recurrent_util import CHUNK_TEST, RECORDS, SCANNED, answers, model

DELTA = [(a, v) for a, v in SCANNED if a.split("+")[0] in ("qwen35", "qwen35moe", "qwen3next")]
N_GEN = 12


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gdn_decode")


@pytest.fixture
def logits(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every forward pass's logits from here on, in order."""
    kept: list[torch.Tensor] = []
    forward = Decoder.forward

    def keep(self: Decoder, *a: Any, **kw: Any) -> torch.Tensor:
        out = forward(self, *a, **kw)
        kept.append(out.clone())
        return out

    monkeypatch.setattr(Decoder, "forward", keep)
    return kept


def _python_path(mp: pytest.MonkeyPatch, m: Any) -> None:
    """Decode steps on the per-layer path, the delta-net's rows in `chunked.gdn_scan`."""
    mp.setattr(m.decoder, "use_fused", False)
    mp.setattr(deltanet, "is_decode_step", lambda *a, **kw: False)


def _decode(
    tmp: Path, arch: str, variant: str, chunk: int, kept: list[torch.Tensor]
) -> list[torch.Tensor]:
    """The logits of each decode step after a one-token prompt (its first sample's come from
    the prompt row)."""
    m = model(tmp, arch, variant, scan_chunk=chunk)
    prompt = RECORDS[arch]["variants"][variant]["answers"]["Q4_K_M"][0]["prompt"][:1]
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=64, block_size=4))
    kept.clear()
    (got,) = answers(eng, [ask(prompt, N_GEN, sampling=PROBS, cache_prompt=False)])
    assert len(got[0]) == N_GEN and len(kept) == N_GEN
    return kept[1:]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("arch,variant", DELTA, ids=map(case_id, DELTA))
def test_decode_rows_are_the_recurrence(
    tmp: Path, arch: str, variant: str, monkeypatch: pytest.MonkeyPatch, logits: list
) -> None:
    want = _decode(tmp, arch, variant, 0, logits)  # the recurrent form throughout
    got = _decode(tmp, arch, variant, CHUNK_TEST, logits)
    assert _same(got, want), "a decode row of the chunked form is not the recurrence's"
    with monkeypatch.context() as mp:
        _python_path(mp, model(tmp, arch, variant, scan_chunk=CHUNK_TEST))
        assert _same(_decode(tmp, arch, variant, CHUNK_TEST, logits), want), "per-layer path"
    real = step_plan._item

    def unmarked(sched: Any, run: Any, start: int, n: int, decode: bool) -> Any:
        return real(sched, run, start, n, False)  # every row in the chunked form

    monkeypatch.setattr(step_plan, "_item", unmarked)
    forced = _decode(tmp, arch, variant, CHUNK_TEST, logits)
    assert not _same(forced, want), "the chunked form's decode rows gave the same bits"


@pytest.mark.parametrize("arch,variant", DELTA, ids=map(case_id, DELTA))
def test_next_turn_resumes_a_decode_made_state(
    tmp: Path, arch: str, variant: str, monkeypatch: pytest.MonkeyPatch, logits: list
) -> None:
    m = model(tmp, arch, variant, scan_chunk=CHUNK_TEST)
    cases = RECORDS[arch]["variants"][variant]["answers"]["Q4_K_M"]
    first = (cases[0]["prompt"] * 2)[:10]  # 4 rows pending in its last chunk of 6
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    (turn1,) = answers(eng, [ask(first, N_GEN, sampling=PROBS)])
    fed = first + turn1[0][:-1]  # the answer as it was fed
    k = next(k for k in range(5, 11) if (len(fed) + k) % CHUNK_TEST > 1)  # rows pending
    second = fed + (cases[1]["prompt"] * 2)[:k]  # a new message
    logits.clear()
    (got,) = answers(eng, [ask(second, 4, sampling=PROBS)])
    got_logits = logits[-3:]  # its decode steps
    _python_path(monkeypatch, m)
    fresh = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    logits.clear()
    (want,) = answers(fresh, [ask(second, 4, sampling=PROBS, cache_prompt=False)])
    assert got[2] > len(first), "the next turn did not resume from a state a decode made"
    assert got[:2] == want[:2]
    assert _same(got_logits, logits[-3:])


def test_corrupt_record_is_refused_by_the_c_step(tmp: Path) -> None:
    """A chunked record whose pending-row count is not one (a damaged slot file, say) is a
    ValueError naming it in the C decode step, not a read past the record."""
    m = model(tmp, *DELTA[0], scan_chunk=CHUNK_TEST)
    mixer = next(b.mixer for b in m.decoder.blocks if isinstance(b.mixer, deltanet.GatedDeltaNet))
    hk, hv, s, k = mixer.spec.dims
    width = mixer.spec.in_width
    good, bad = torch.zeros(mixer.state_size), torch.zeros(mixer.state_size)
    n_conv = (k - 1) * mixer.conv_dim
    bad[n_conv + gdn_chunk.record_size(hv, s, CHUNK_TEST) - 1] = 99.0  # the count slot
    mixed = torch.randn(1, width)
    out = [torch.empty(mixer.state_size)]
    kernel.gdn_step(mixed, [good], out, mixer._c, mixer.state_size)  # a valid record passes
    with pytest.raises(ValueError, match="corrupt"):
        kernel.gdn_step(mixed, [bad], out, mixer._c, mixer.state_size)
