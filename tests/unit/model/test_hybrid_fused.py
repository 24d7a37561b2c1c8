"""The fused C layers with Mamba-2 mixers (granitehybrid decode steps, `kernels/layers.c`):
the same bits as the per-layer path, alone and batched, with adapters on the Mamba-2, attention
and feed-forward projections; and the Mamba-2 step sizes (`ssm_scan.dt_da`) of each value
alone, whatever the rows around it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.kernels import backend, ssm_scan
from loraserve.lora.adapter_write import write_gguf_lora
from loraserve.model.loader import load_model
from tests.engine_util import ask
from tests.unit.model.archs_util import PROBS
from tests.unit.model.archs_util import RECORDS as ALL
from tests.unit.model.recurrent_util import (
    RECORDS,
    RECURRENT_STEMS,
    answers,
    check_fused_decode,
    stem_adapter,
)
from tests.unit.model.recurrent_util import model as recorded_model

needs_c = pytest.mark.skipif(backend() != "c" or not ssm_scan.available(), reason="no C kernels")
STEMS = (*RECURRENT_STEMS, "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
         "ffn_down")  # fmt: skip


@needs_c
@pytest.mark.skipif("granitehybrid" not in RECORDS, reason="no recorded granitehybrid")
def test_fused_hybrid_decode_equals_the_per_layer_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three requests decoding together (one row each per step), two under adapter mixes
    that touch ssm_in/ssm_out and the attention and FFN projections: every generated token
    and its top-2 probabilities equal the per-layer path's, and the fused call ran."""
    m = recorded_model(tmp_path, "granitehybrid", "dense")
    fused = m.decoder._fused()
    assert fused is not None and fused.mamba_layers, "granitehybrid should take the fused path"
    rec = RECORDS["granitehybrid"]["variants"]["dense"]
    pairs = stem_adapter(rec, 5, STEMS)
    assert any(".ssm_in." in n for n in pairs) and any(".ssm_out." in n for n in pairs)
    lora = tmp_path / "granitehybrid-lora.gguf"
    write_gguf_lora(lora, "granitehybrid", pairs, qk_heads=(m.config.n_heads,) * 2)
    check_fused_decode(m, lora, rec["answers"]["Q4_K_M"], monkeypatch)


@needs_c
def test_step_sizes_are_each_values_own() -> None:
    """dt = softplus(raw + bias), da = exp(dt a) as libm computes each value alone: within
    an ulp or two of float64, and a row's bits the same alone, in a batch and strided."""
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(37, 2 * 13, generator=g) * 8
    raw[0, 5:8] = torch.tensor([25.0, 20.0, -90.0])  # past softplus' threshold, and tiny
    bias, a = torch.randn(13, generator=g), -torch.rand(13, generator=g) * 4
    dt, da = ssm_scan.dt_da(raw[:, 5:18], bias, a)  # a column range: row stride 26
    x = (raw[:, 5:18] + bias).double()
    ref = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    assert torch.allclose(dt.double(), ref, rtol=3e-7, atol=0)
    ref_a = torch.exp((dt * a).double())  # the product rounded to float32, as the kernel's
    assert torch.allclose(da.double(), ref_a, rtol=3e-7, atol=1e-30)
    assert dt[0, 0] == torch.tensor(25.0) + bias[0] and 0.0 < float(dt[0, 2]) < 1e-30
    for r in (0, 17, 36):
        one = ssm_scan.dt_da(raw[r : r + 1, 5:18].contiguous(), bias, a)
        assert torch.equal(one[0][0], dt[r]) and torch.equal(one[1][0], da[r])


@needs_c
@pytest.mark.parametrize("arch", [a for a in ("granite", "granitemoe") if a in ALL])
def test_granite_residual_scale_fused_equals_the_per_layer_path(tmp_path: Path, arch: str) -> None:
    """Dense granite (the residual scale) takes the fused path for prompts and decode steps:
    its answers, alone and batched, are the per-layer path's bit for bit."""
    from tests.arch_models import write_model

    rec = ALL[arch]["variants"]["dense"]
    types = {k: int(t) for k, t in rec["files"]["Q4_K_M"]["types"].items()}
    m = load_model(write_model(rec, tmp_path / f"{arch}.gguf", types))
    assert m.config.residual_scale != 1.0 and m.decoder._fused() is not None
    prompts = [c["prompt"] for c in rec["answers"]["Q4_K_M"][:3]]

    def run(use_fused: bool) -> list[tuple[list, list, int]]:
        m.decoder.use_fused = use_fused
        eng = Engine(m, EngineConfig(n_slots=3, n_ctx=3 * 128, block_size=4))
        asks = [ask(p, 5, sampling=PROBS, cache_prompt=False) for p in prompts]
        return answers(eng, asks)

    try:
        assert run(True) == run(False)
    finally:
        m.decoder.use_fused = True
