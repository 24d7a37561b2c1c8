"""Latent attention's query and cache rows in one C call (`kernels.mla.mla_prep`) equal the
tensor path they replace (`LatentAttention._prep_torch`) bit for bit: on random rows with
several heads, strided per-head inputs, float32 and float16 pools and any number of tokens;
and a whole deepseek2 model's logits are the same on either path."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.kernels import mla as mla_kernel
from loraserve.model.attn.mla import LatentAttention
from loraserve.model.loader import load_model
from loraserve.model.weights import unpermute_qk
from tests.arch_models import write_model

pytestmark = pytest.mark.skipif(not mla_kernel.available(), reason="needs the C kernels")
SPEC = Path(__file__).resolve().parents[2] / "data" / "archs" / "deepseek2.json"


def _layer(h: int, nope: int, rank: int, r: int) -> SimpleNamespace:
    """The attributes `_prep_torch` reads, built as `LatentAttention.__init__` builds them."""
    qd = nope + r
    q_rows = torch.arange(h * qd).view(h, qd)
    q_rows[:, nope:] = unpermute_qk(q_rows[:, nope:].T.contiguous(), 1).T
    kv_rows = torch.arange(rank + r)
    kv_rows[rank:] = unpermute_qk(kv_rows[rank:], 1)
    g = torch.Generator().manual_seed(h)
    return SimpleNamespace(
        cfg=SimpleNamespace(n_heads=h, rms_eps=1e-6), q_rows=q_rows.reshape(-1),
        kv_rows=kv_rows, nope=nope, rope_dim=r, rank=rank,
        kv_a_norm=1 + 0.1 * torch.randn(rank, generator=g), perm=kv_rows[rank:] - rank,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("t", [1, 3, 40])
def test_prep_kernel_equals_tensor_path(t: int, dtype: torch.dtype) -> None:
    h, nope, rank, r, s = 3, 16, 64, 16, 100
    lay = _layer(h, nope, rank, r)
    g = torch.Generator().manual_seed(t)
    q = torch.randn(t, h * (nope + r), generator=g) * 3
    kv = torch.randn(t, rank + r, generator=g) * 3
    kb = torch.randn(h, t, rank + 5, generator=g)[:, :, :rank].transpose(0, 1)  # strided
    ang = torch.rand(t, r // 2, generator=g) * 6
    cos, sin = ang.cos(), ang.sin()
    slots = torch.randperm(s, generator=g)[:t]
    want_cache = torch.full((s, 1, rank + r), 7.0).to(dtype)
    got_cache = want_cache.clone()
    want = LatentAttention._prep_torch(lay, q, kv, kb, (cos, sin), slots, want_cache)  # type: ignore[arg-type]
    got = mla_kernel.mla_prep(q, kv, kb, lay.perm, lay.kv_a_norm, 1e-6, cos, sin, slots,
                              got_cache, nope + r)  # fmt: skip
    assert torch.equal(got, want)
    assert torch.equal(got_cache, want_cache)  # the rows at the slots, and nothing else


def test_prep_refuses_a_slot_outside_the_pool() -> None:
    lay = _layer(2, 16, 32, 16)
    q, kv, kb = torch.zeros(1, 64), torch.zeros(1, 48), torch.zeros(1, 2, 32)
    cos, sin, cache = torch.ones(1, 8), torch.zeros(1, 8), torch.zeros(4, 1, 48)
    with pytest.raises(ValueError):
        mla_kernel.mla_prep(q, kv, kb, lay.perm, lay.kv_a_norm, 1e-6, cos, sin,
                            torch.tensor([4]), cache, 32)  # fmt: skip


@pytest.mark.parametrize("kv", [torch.float16, torch.float32], ids=["f16", "f32"])
def test_model_logits_equal_on_either_path(
    tmp_path: Path, kv: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = json.loads(SPEC.read_text())["variants"]["moe"]
    model = load_model(write_model(spec, tmp_path / "deepseek2.gguf"))
    case = spec["answers"]["F32"][0]
    seq = case["prompt"] + case["tokens"][:-1]

    def logits() -> torch.Tensor:
        runner = ModelRunner(model.decoder, 4, kv)
        n_blocks = -(-len(seq) // 4)
        runner.ensure_capacity(n_blocks)
        item = BatchItem(seq, 0, len(seq), list(range(n_blocks)), True, {}, n_logits=len(seq))
        return runner.forward([item])

    got = logits()
    monkeypatch.setattr(mla_kernel, "available", lambda: False)
    assert torch.equal(got, logits())
