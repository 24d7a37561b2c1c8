"""The fused C layers with optional mixers and FFNs, the short-convolution mixer and a Mamba-2
mixer beside attention (`kernels/layers.c`, `layers_conv.h`): mamba2 (Mamba-2 layers without
FFN), nemotron_h (a Mamba-2 alone, attention alone without rope, relu(up)^2 FFN alone), lfm2
(short conv and attention, gated FFNs) and falcon-h1 (attention + Mamba-2 summed, gated FFN)
decode in one C call per step with the per-layer path's bits, alone and batched, with
adapters on the mixers' and FFNs' projections; and the C entry point refuses layer
descriptions that do not fit."""

from __future__ import annotations

import copy
import ctypes
from pathlib import Path

import pytest
import torch

from loraserve.cbuild import bind
from loraserve.kernels import backend, ssm_scan
from loraserve.kernels.layers_abi import SIGNATURES, ConvC, LayerC, ModelC, ProjC, StepC
from loraserve.lora.adapter_write import write_gguf_lora
from loraserve.model.loader import load_model
from loraserve.model.recurrent.shortconv import ShortConv
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
# each arch's layer kinds as the fused call sees them: (mixer, FFN) per layer
KINDS = {
    "mamba2": [("mamba", "none"), ("mamba", "none")],
    "nemotron_h": [("attn", "none"), ("mamba", "none"), ("none", "relu_sqr")],
    "lfm2": [("attn", "gated"), ("conv", "gated")],
    "falcon-h1": [("attn+mamba", "gated"), ("attn+mamba", "gated")],
}


def _kinds(fused) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    out = []
    for L in fused._specs:
        mix = "none" if L.qkv is None else "attn+mamba" if L.ssm_in else "mamba" if L.mamba \
            else "conv" if L.conv else "attn"  # fmt: skip
        ffn = "none" if L.gate_up is None else "relu_sqr" if L.relu_sqr else "gated"
        out.append((mix, ffn))
    return out


@needs_c
@pytest.mark.parametrize("arch", [a for a in KINDS if a in RECORDS])
def test_fused_decode_of_optional_mixers_and_ffns_equals_the_per_layer_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str
) -> None:
    """Three requests decoding together (one row each per step), two under adapter mixes on
    every mixer and FFN projection of the recorded model: every generated token and its
    top-2 probabilities equal the per-layer path's, alone and batched, and fused steps of
    three rows ran."""
    m = recorded_model(tmp_path, arch, "dense")
    fused = m.decoder._fused()
    assert fused is not None, f"{arch} should take the fused path"
    assert _kinds(fused) == KINDS[arch]
    rec = RECORDS[arch]["variants"]["dense"]
    pairs = stem_adapter(rec, 11, STEMS)
    names = {n.split(".", 2)[2] for n in pairs}
    for L in fused._specs:  # every projection the fused call runs carries a delta
        for p in L.projections:
            for n in () if p is None else p.names:
                assert n.split(".", 2)[2] in names, n
    lora = tmp_path / f"{arch}-lora.gguf"
    write_gguf_lora(lora, arch, pairs, qk_heads=(m.config.n_heads, m.config.n_kv_heads))
    check_fused_decode(m, lora, rec["answers"]["Q4_K_M"], monkeypatch)


@needs_c
@pytest.mark.skipif("mamba2" not in RECORDS, reason="no recorded mamba2")
def test_converted_mamba2_file_decodes_fused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mamba2 file as llama.cpp's converter writes it (head_count 0, no head_count_kv,
    feed_forward_length 0: `test_mamba2_converted_keys`) takes the fused call too, with the
    per-layer path's bits alone and batched, adapters on ssm_in and ssm_out."""
    rec = copy.deepcopy(RECORDS["mamba2"]["variants"]["dense"])
    unused = ("mamba2.attention.head_count", "mamba2.attention.head_count_kv",
              "mamba2.feed_forward_length")  # fmt: skip
    rec["metadata"] = [kv for kv in rec["metadata"] if kv[0] not in unused] + [
        ["mamba2.attention.head_count", "UINT32", 0],
        ["mamba2.feed_forward_length", "UINT32", 0],
    ]
    types = {k: int(t) for k, t in rec["files"]["Q4_K_M"]["types"].items()}
    m = load_model(write_model(rec, tmp_path / "mamba2-converted.gguf", types))
    fused = m.decoder._fused()
    assert fused is not None and _kinds(fused) == KINDS["mamba2"]
    lora = tmp_path / "mamba2-converted-lora.gguf"
    write_gguf_lora(lora, "mamba2", stem_adapter(rec, 3, STEMS))
    check_fused_decode(m, lora, rec["answers"]["Q4_K_M"], monkeypatch)


@needs_c
@pytest.mark.skipif("lfm2" not in RECORDS, reason="no recorded lfm2")
def test_short_conv_records_keep_the_state_shape(tmp_path: Path) -> None:
    """A fused step's short-conv state records are [L-1, C] (`ShortConv.state_shape`, what slot
    files and the per-layer path read), and the mixer's record size is its state's."""
    m = recorded_model(tmp_path, "lfm2", "dense")
    conv = next(b.mixer for b in m.decoder.blocks if isinstance(b.mixer, ShortConv))
    assert conv.record_shape() == ShortConv.state_shape(m.config)
    n = torch.Size(conv.record_shape()).numel()
    assert conv.state_size == conv.fused_spec().state_size == n


# ls_decoder_layers with one layer of 8 hidden values: its projections' weights are null (type
# 0, refused by the matmul: -1 once every size fits), so a layer that does not fit must be
# refused (-3) before any of them is read
def _call(layer: LayerC, *, st_records: bool = True) -> int:
    lib = bind(SIGNATURES)
    arr = (LayerC * 1)(layer)
    model = ModelC(1, 8, 1, 1, 8, 4, 1e-6, 1.0, 0, ctypes.addressof(arr), 1.0, 8, 8, 0, 0)
    buf = torch.zeros(2, 16)  # a state record [L-1, C] before the row, one after
    before = (ctypes.c_void_p * 1)(buf[0].data_ptr())
    after = (ctypes.c_void_p * 1)(buf[1].data_ptr())
    kv = (ctypes.c_void_p * 1)(None)
    step = StepC(None, None, None, 0, None, None, 0, None, None, None, None,
                 ctypes.addressof(kv), ctypes.addressof(kv), 0, None,
                 ctypes.addressof(before) if st_records else None,
                 ctypes.addressof(after) if st_records else None)  # fmt: skip
    x = torch.zeros(1, 8)
    return lib.ls_decoder_layers(ctypes.byref(model), ctypes.byref(step), x.data_ptr(), 1, 1)


def _proj(k: int, n: int) -> ProjC:
    p = ProjC()
    p.nparts, p.n_out, p.ns[0], p.row_bytes[0], p.cols[0] = 1, n, n, k, 0
    return p


@needs_c
def test_decoder_layers_refuse_layer_kinds_that_do_not_fit() -> None:
    """A layer with neither mixer nor FFN, two mixers, an FFN form, no_mixer or beside flag
    out of range, beside attention without a Mamba-2 mixer, a short conv without taps, of one
    tap, without state records or with an in_proj of another width, an FFN whose gate_up does
    not fit its form or without its norm: -3 before any weight is read."""
    w = torch.ones(8)
    taps = torch.ones(3, 8)
    conv = ConvC(taps.data_ptr(), 8, 3)
    bad_conv = ConvC(None, 8, 3)
    short = ConvC(taps.data_ptr(), 8, 1)

    def layer(**kw) -> LayerC:  # type: ignore[no-untyped-def]
        L = LayerC()
        L.qkv, L.o = _proj(8, 24), _proj(8, 8)
        L.gate_up, L.down, L.ffn_form = _proj(8, 4), _proj(4, 8), 2  # relu(up)^2, F = 4
        L.attn_norm, L.ffn_norm = w.data_ptr(), w.data_ptr()
        L.norm_n[0] = L.norm_n[3] = 8
        L.conv = ctypes.addressof(conv)
        for k, v in kw.items():
            setattr(L, k, v)
        return L

    cases = {
        "ffn form 3": layer(ffn_form=3),
        "ffn form -1": layer(ffn_form=-1),
        "neither mixer nor FFN": layer(no_mixer=1, ffn_form=1, conv=None),
        "no mixer and a conv": layer(no_mixer=1),
        "no_mixer 2": layer(no_mixer=2, conv=None),
        "conv without taps": layer(conv=ctypes.addressof(bad_conv)),
        "conv of 1 tap": layer(conv=ctypes.addressof(short)),
        "conv in_proj of another width": layer(qkv=_proj(8, 23)),
        "gated FFN's gate_up of F": layer(ffn_form=0),
        "relu^2 FFN's gate_up of 2 F": layer(gate_up=_proj(8, 8)),
        "FFN without its norm": layer(ffn_norm=None),
        "beside without a Mamba-2 mixer": layer(beside=1),
        "beside 2": layer(beside=2),
    }
    assert _call(layer()) == -1  # every size fits: the null weights' type is refused
    got = {k: _call(L) for k, L in cases.items()}
    got["conv without state records"] = _call(layer(), st_records=False)
    assert got == dict.fromkeys(got, -3)
