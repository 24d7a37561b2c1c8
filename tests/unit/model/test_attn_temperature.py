"""mistral3's attention temperature (``attention.temperature_scale``: every layer's q after rope
times 1 + s log(floor(pos / n_ctx_orig) + 1)). Its answers against llama-server are
test_archs's ``mistral3+temp`` cases (recorded with s = 0.5 and an original context of 16, so
the prompts cross 16, 32 and 48). Here: the fused decode layers, which leave the factor out,
run only for steps whose every position is below 16 (where it is exactly 1), and a model
decoding through them gives the per-layer path's bits, prefill chunked or not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraserve.kernels import backend
from loraserve.kernels.layers import FusedLayers
from loraserve.model.archs import UnsupportedModelError
from loraserve.model.loader import load_model
from tests.arch_models import write_model
from tests.tiny import our_logits
from tests.unit.model.archs_util import RECORDS, load, model_file

KEY = "mistral3+temp"


def test_the_file_reads_as_llama_cpp_does(tmp_path: Path) -> None:
    cfg = load(model_file(tmp_path, KEY, "dense", "F32"), KEY).config
    assert cfg.attn_temp == (16.0, 0.5, 0.0) and cfg.attn_temp_all


@pytest.mark.skipif(backend() != "c", reason="no C compiler here")
def test_fused_steps_only_below_the_original_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load(model_file(tmp_path, KEY, "dense", "Q8_0"), KEY)
    dec = model.decoder
    assert dec._fused() is not None, "mistral3 with a temperature keeps the fused layers"
    calls: list[int] = []
    call = FusedLayers.__call__

    def counted(self: FusedLayers, x: torch.Tensor, *a: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return call(self, x, *a)

    monkeypatch.setattr(FusedLayers, "__call__", counted)
    ids = torch.randint(3, 120, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    runs = {}
    for fused in (True, False):
        dec.use_fused = fused
        calls.clear()
        runs[fused] = [our_logits(model, ids, chunk) for chunk in (1, 6, 30)]
        # chunk 1: steps at positions 0..15 fused; chunk 6: the prefill (0..5) and 6..15
        assert len(calls) == (16 + 11 if fused else 0)
    for a, b in zip(runs[True], runs[False], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(runs[True][0], runs[True][1]) and torch.equal(runs[True][0], runs[True][2])


def test_no_original_context_is_refused(tmp_path: Path) -> None:
    rec = dict(RECORDS[KEY]["variants"]["dense"])
    drop = ("mistral3.rope.scaling.original_context_length", "mistral3.context_length")
    rec["metadata"] = [m for m in rec["metadata"] if m[0] not in drop]
    with pytest.raises(UnsupportedModelError, match="original context"):
        load_model(write_model(rec, tmp_path / "no_ctx.gguf"))
