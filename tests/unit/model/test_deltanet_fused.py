"""qwen35's decode steps in the fused C layers (`kernels/layers.c`: gated delta-net mixers,
gated attention with a partial rope): the same bits as the per-layer path, alone and batched,
with adapters on the delta-net, attention and FFN projections; and the decode step's C mixer
(`kernels.deltanet.gdn_step`) against the mixer's general path on the same rows."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from loraserve.kernels import backend, ssm_scan
from loraserve.kernels.sigmoid_gate import sigmoid_gate
from loraserve.lora.adapter_write import write_gguf_lora
from loraserve.model.loader import LoadedModel, load_model
from loraserve.model.recurrent.deltanet import GatedDeltaNet
from tests.arch_models import write_model
from tests.unit.model.recurrent_util import (
    RECORDS,
    RECURRENT_STEMS,
    check_fused_decode,
    stem_adapter,
)
from tests.unit.model.recurrent_util import model as recorded_model

needs_c = pytest.mark.skipif(backend() != "c" or not ssm_scan.available(), reason="no C kernels")
STEMS = (*RECURRENT_STEMS, "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
         "ffn_down")  # fmt: skip


def _partial_rope_model(tmp: Path, rec: dict[str, Any], n_rot: int) -> LoadedModel:
    """The recorded qwen35 model with its rope on the first ``n_rot`` dims of each head (the
    real Qwen3.5's 64 of 256: `attn.variants.partial_rope`)."""
    spec = copy.deepcopy(rec)
    for kv in spec["metadata"]:
        if kv[0] in ("qwen35.rope.dimension_count", "qwen35.rope.dimension_count_swa"):
            kv[2] = n_rot
        if kv[0] == "qwen35.rope.dimension_sections":
            kv[2] = [n_rot // 4] * 4
    types = {k: int(t) for k, t in spec["files"]["Q4_K_M"]["types"].items()}
    return load_model(write_model(spec, tmp / "qwen35-partial.gguf", types))


@needs_c
@pytest.mark.skipif("qwen35" not in RECORDS, reason="no recorded qwen35")
@pytest.mark.parametrize("n_rot", [None, 32], ids=["recorded", "partial-rope"])
def test_fused_qwen35_decode_equals_the_per_layer_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n_rot: int | None
) -> None:
    """Three requests decoding together (one row each per step), two under adapter mixes on
    the delta-net (attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_out), attention and FFN
    projections: every generated token and its top-2 probabilities equal the per-layer
    path's, alone and batched, and fused steps of three rows ran; with the recorded rope on
    whole heads and on a quarter of each."""
    rec = RECORDS["qwen35"]["variants"]["dense"]
    if n_rot is None:
        m = recorded_model(tmp_path, "qwen35", "dense")
    else:
        m = _partial_rope_model(tmp_path, rec, n_rot)
        assert m.config.partial_rope and m.config.rope_dim == n_rot
    fused = m.decoder._fused()  # `model.fused.build_fused`'s
    assert fused is not None and fused.out_gate
    assert fused.rope_dim == (n_rot or m.config.head_dim)
    assert any(isinstance(b.mixer, GatedDeltaNet) for b in m.decoder.blocks)
    assert len(fused.mamba_layers) == sum(b.mixer is not None for b in m.decoder.blocks)
    pairs = stem_adapter(rec, 7, STEMS)
    for stem in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out", "attn_q."):
        assert any(f".{stem}" in n for n in pairs), stem
    lora = tmp_path / "qwen35-lora.gguf"
    write_gguf_lora(lora, "qwen35", pairs)
    check_fused_decode(m, lora, rec["answers"]["Q4_K_M"], monkeypatch)


@needs_c
def test_sigmoid_gate_each_value_alone() -> None:
    """The attention's output gate: a * sigmoid(g) with the sigmoid in double rounded to
    float32 (what torch's double sigmoid gives, within its last double place), each value
    the same alone, batched and read through a strided view."""
    gen = torch.Generator().manual_seed(3)
    qg = torch.randn(5, 4, 2 * 16, generator=gen) * 9  # each head's q, then its gate
    a = torch.randn(5, 4 * 16, generator=gen)
    got = sigmoid_gate(a, qg[:, :, 16:])
    want = a * torch.sigmoid(qg[:, :, 16:].double()).float().reshape(5, 64)
    torch.testing.assert_close(got, want, rtol=1.2e-7, atol=0)
    for r in (0, 4):
        one = sigmoid_gate(a[r : r + 1], qg[r : r + 1, :, 16:].contiguous())
        assert torch.equal(one[0].view(torch.int32), got[r].view(torch.int32))
    meta = sigmoid_gate(a.to("meta"), qg[:, :, 16:].to("meta"))  # not CPU memory: never C's
    assert meta.device.type == "meta" and meta.shape == (5, 64)


@needs_c
@pytest.mark.parametrize("s,hk,hv,interleave", [(32, 2, 4, False), (32, 2, 4, True),
                                                 (20, 1, 3, False), (8, 4, 4, True)])  # fmt: skip
def test_decode_step_equals_its_pieces(s: int, hk: int, hv: int, interleave: bool) -> None:
    """`gdn_step` on three rows of three sequences: the bits of the general path's calls one
    at a time (conv_step, the q/k norms times 1/sqrt(S), gdn_gates, gdn_recur, the output
    norm, SiLU(z) times it), outputs and new state records alike; S = 20 runs the
    recurrence's transposing form, the others its register tiles."""
    from loraserve.kernels import deltanet as kernel
    from loraserve.kernels.layers_spec import GdnSpec
    from loraserve.model.layers import gated_act, rms_norm

    gen = torch.Generator().manual_seed(s * 10 + hv + interleave)
    t, k, cd, vs = 3, 4, 2 * hk * s + hv * s, hv * s
    r = hv // hk
    taps = torch.randn(k, cd, generator=gen)
    norm, dt_b = torch.randn(s, generator=gen), torch.randn(hv, generator=gen)
    a = -torch.rand(hv, generator=gen) * 3
    if interleave:  # per key head its r betas, then its r alphas
        g = torch.arange(hv) // r * 2 * r + torch.arange(hv) % r
        cols = torch.cat((g, g + r))
    else:
        cols = torch.arange(2 * hv)
    eps, inv = 1e-6, torch.tensor(1.0 / s**0.5, dtype=torch.float32)
    spec = GdnSpec(taps, torch.ones(cd), torch.ones(s), norm, dt_b, a, cols, eps, eps / s,
                   inv.item(), (hk, hv, s, k), interleave)  # fmt: skip
    c = spec.c_struct()
    mixed = torch.randn(t, cd + vs + 2 * hv + 5, generator=gen)[:, : cd + vs + 2 * hv] * 2
    st_in = [torch.randn(spec.state_size, generator=gen) * 0.3 for _ in range(t)]
    got_st = [torch.full((spec.state_size,), float("nan")) for _ in range(t)]
    got = kernel.gdn_step(mixed, st_in, got_st, c, spec.state_size)
    n_conv = (k - 1) * cd
    want_st = [torch.empty(spec.state_size) for _ in range(t)]
    act = torch.cat([kernel.conv_step(st_in[q][:n_conv], mixed[q : q + 1, :cd], taps, None,
                                      torch.ones(1, cd), want_st[q][:n_conv])
                     for q in range(t)])  # fmt: skip
    qk = rms_norm(act[:, : 2 * hk * s].reshape(t, 2 * hk, s), torch.ones(s), eps / s) * inv
    kmap = torch.arange(hv) // r if interleave else torch.arange(hv) % hk
    q_, k_ = qk[:, :hk][:, kmap].contiguous(), qk[:, hk:][:, kmap].contiguous()
    gg, beta = kernel.gdn_gates(mixed[:, cd + vs :], cols, dt_b, a)
    o = torch.empty(t, hv, s)
    kernel.gdn_recur([(q, q + 1) for q in range(t)], [x[n_conv:] for x in st_in],
                     [x[n_conv:] for x in want_st], q_, k_, act[:, 2 * hk * s :].reshape(t, hv, s),
                     gg, beta, inv.item(), o, [[] for _ in range(t)])  # fmt: skip
    normed = rms_norm(o, norm, eps).view(t, vs)
    want = gated_act(mixed[:, cd : cd + vs].contiguous(), normed, "silu")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    for x, y in zip(got_st, want_st, strict=True):
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))
