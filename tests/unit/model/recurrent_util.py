"""The recorded recurrent and hybrid architectures (tests/data/archs/ and archs/recurrent/):
their records, their models rebuilt from the specs (the very files llama-server answered on),
the engine's answers with their top-2 probabilities, random adapters on chosen projections, and
the check that a model's fused C layers give the per-layer path's bits: the toolkit of
test_recurrent.py and the hybrid tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.kernels.layers import FusedLayers
from loraserve.model import archs
from loraserve.model.decoder import Decoder
from loraserve.model.loader import LoadedModel, load_model
from tests.arch_models import tensor_digest, write_model
from tests.engine_util import ask, run_and_drain
from tests.unit.model.archs_util import DATA, PROBS, case_id

RECORDS = {
    p.stem: r
    for p in sorted([*DATA.glob("*.json"), *DATA.glob("recurrent/*.json")])
    if (r := json.loads(p.read_text())).get("arch") in archs.ARCHS
    and archs.get(r["arch"]).recurrent
}
VARIANTS = [(a, v) for a, r in RECORDS.items() for v in r["variants"]]
RECURRENT_STEMS = ("shortconv.in_proj", "shortconv.out_proj", "ssm_in", "ssm_out", "attn_qkv",
                   "attn_gate", "ssm_beta", "ssm_alpha", "ssm_ba")  # fmt: skip
_MODELS: dict[tuple[str, str, str, int], LoadedModel] = {}
# the variants with delta-net or Mamba-2 layers (whose scans have a chunked form), each also
# tested in that form with chunks of CHUNK_TEST positions: 6, so that chunks end inside the
# tests' 4-token blocks and blocks inside chunks
SCANNED = [(a, v) for a, v in VARIANTS if a.split("+")[0] in (
    "falcon-h1", "granitehybrid", "nemotron_h", "nemotron_h_moe", "qwen35", "qwen35moe",
    "qwen3next", "mamba2")]  # fmt: skip
CHUNK_TEST = 6
FORMS = [(a, v, 0) for a, v in VARIANTS] + [(a, v, CHUNK_TEST) for a, v in SCANNED]


def form_id(case: tuple[str, str, int]) -> str:
    """A test id of (arch, variant, scan chunk)."""
    a, v, c = case
    return case_id((a, v)) + (f"-chunked{c}" if c else "")


def model(
    tmp: Path, arch: str, variant: str, qtype: str = "Q4_K_M", scan_chunk: int = 0
) -> LoadedModel:
    """The recorded model of ``arch``/``variant`` in ``qtype``, rebuilt once (the first
    caller's ``tmp``); its tensors' bytes checked against the record. ``scan_chunk`` > 0:
    its delta-net and Mamba-2 layers in the chunked form, chunks of that many positions."""
    key = (arch, variant, qtype, scan_chunk)
    if key not in _MODELS:
        rec = RECORDS[arch]["variants"][variant]
        types = None
        if qtype != "F32":
            types = {k: int(t) for k, t in rec["files"][qtype]["types"].items()}
        path = write_model(rec, tmp / f"{arch}-{variant}-{qtype}.gguf", types)
        # the very file llama-server answered on (its tensors' bytes, as recorded)
        assert tensor_digest(path)[0] == rec["files"][qtype]["tensors_sha256"]
        _MODELS[key] = load_model(path, scan_chunk=scan_chunk)
    return _MODELS[key]


def answers(eng: Engine, asks: list[dict[str, Any]]) -> list[tuple[list, list, int]]:
    """Each request's generated tokens, their top-2 probabilities and its cached prompt tokens."""
    out = []
    for evs in run_and_drain(eng, asks):
        assert evs[-1].error is None, evs[-1].error
        gen = [e for e in evs if e.token is not None]
        out.append(([e.token for e in gen], [e.probs for e in gen], evs[-1].n_cached))
    return out


def stem_adapter(rec: dict[str, Any], seed: int, stems: tuple[str, ...]) -> dict[str, Any]:
    """Random rank-4 LoRA pairs (A [4, in], B [out, 4]) on every block matrix whose name's
    stem (``blk.N.<stem>.weight``) is in ``stems``."""
    g = torch.Generator().manual_seed(seed)
    pairs = {}
    for name, shape, _ in rec["tensors"]:
        if name.startswith("blk.") and name.endswith(".weight") and len(shape) == 2:
            if name.split(".", 2)[2].removesuffix(".weight") in stems:
                pairs[name] = (torch.randn(4, shape[1], generator=g) * 0.05,
                               torch.randn(shape[0], 4, generator=g) * 0.05)  # fmt: skip
    return pairs


def check_fused_decode(
    m: LoadedModel, lora: Path, cases: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three requests (two of ``cases``' prompts, the first twice) decoding under the mixes
    {0: 0.7}, none and {0: -1.3} of adapter ``lora``, alone and then together: every step's
    logits (bit for bit), token and top-2 probabilities are the per-layer path's, fused steps
    of three rows ran, the batched answers are the answers alone, and the adapter changes the
    answer."""
    calls = []
    logits: list[torch.Tensor] = []
    real, forward = FusedLayers.__call__, Decoder.forward

    def counted(self: FusedLayers, *a: Any, **kw: Any) -> torch.Tensor:
        calls.append(a[0].shape[0])
        return real(self, *a, **kw)

    def kept(self: Decoder, *a: Any, **kw: Any) -> torch.Tensor:
        out = forward(self, *a, **kw)
        logits.append(out.clone())
        return out

    monkeypatch.setattr(FusedLayers, "__call__", counted)
    monkeypatch.setattr(Decoder, "forward", kept)
    prompts = [cases[0]["prompt"], cases[0]["prompt"], cases[2]["prompt"]]  # 0, 1: mix alone
    mixes: list[dict[int, float]] = [{0: 0.7}, {}, {0: -1.3}]

    def run(use_fused: bool) -> list[tuple[list, list, int]]:
        m.decoder.use_fused = use_fused
        eng = Engine(m, EngineConfig(n_slots=3, n_ctx=3 * 128, block_size=4))
        eng.load_adapter(lora, 0.0).result()
        asks = [ask(p, 6, mix, sampling=PROBS, cache_prompt=False)
                for p, mix in zip(prompts, mixes, strict=True)]  # fmt: skip
        alone = [answers(eng, [a])[0] for a in asks]
        return alone + answers(eng, asks)

    try:
        got = run(True)
        n_fused, got_logits = len(calls), logits[:]
        logits.clear()
        want = run(False)
    finally:
        m.decoder.use_fused = True
    assert len(got_logits) == len(logits)
    bad = [i for i, (a, b) in enumerate(zip(got_logits, logits, strict=True))
           if not torch.equal(a, b)]  # fmt: skip
    assert not bad, f"{len(bad)} of {len(logits)} steps' logits differ from the per-layer path's"
    assert n_fused > 0 and len(calls) == n_fused, "the fused call did not run (or ran unasked)"
    assert 3 in calls, "no batched decode step of three rows ran fused"
    assert got == want
    assert got[:3] == got[3:], "batched answers differ from the answers alone"
    assert got[0][1] != got[1][1], "the adapter changes nothing: no test"
