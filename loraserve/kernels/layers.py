"""A decoder's layers in one C call (`layers.c`), LoRA deltas included.

The Python loop over layers costs 5-7 ms of a 25 ms Gemma 270M decode step in tensor ops
and kernel calls; `FusedLayers` runs the same kernels in the same order in one call (the
step's adapters as a scale table and each adapter's per-target pointers), so its numbers
equal the Python path's bit for bit (tests compare both). Layers attend (qwen35's gated
attention too: output gates, a partial rope), or run a Mamba-2 (granitehybrid, mamba2,
nemotron-h), gated delta-net (qwen35) or short-convolution (lfm2) mixer in decode steps, whose
state records the caller passes (`recurrent.records.decode_records`), or no mixer; their FFN is
gated, relu(up)^2 or absent. Which decoders build them: `model.fused.build_fused`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Hashable, Mapping
from typing import Any

import torch

from loraserve.cbuild import bind
from loraserve.kernels.layers_abi import I64 as _I
from loraserve.kernels.layers_abi import PROJS as _PROJS
from loraserve.kernels.layers_abi import SIGNATURES as _SIGNATURES
from loraserve.kernels.layers_abi import LayerC as _Layer
from loraserve.kernels.layers_abi import LoraC as _Lora
from loraserve.kernels.layers_abi import LoraWC as _LoraW
from loraserve.kernels.layers_abi import ModelC as _Model
from loraserve.kernels.layers_abi import P as _P
from loraserve.kernels.layers_abi import StepC as _Step
from loraserve.kernels.layers_spec import (
    ConvSpec,
    GdnSpec,
    LayerSpec,
    MambaSpec,
    ProjSpec,
    check_layer,
    halves,
    mamba_widths,
    mixer_widths,
    numel,
    proj_struct,
    ptr,
)
from loraserve.kernels.rowops import ACTS

__all__ = ["ConvSpec", "FusedLayers", "GdnSpec", "LayerSpec", "MambaSpec", "ProjSpec"]
_LONG, _I32, _F32 = torch.long, torch.int32, torch.float32


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t as a contiguous tensor of ``dtype``: t itself where it is one (no torch op)."""
    if t.dtype is not dtype:
        t = t.to(dtype)
    return t if t.is_contiguous() else t.contiguous()


class FusedLayers:
    """Every layer of a decoder as one C call. Built once per decoder; holds the weight
    tensors it points into (they must stay alive and in place). res_scale: each branch's
    output times it before its residual add (granite); lanes: torch's float sum width
    (`ssm_scan.vector_lanes`), needed where a layer is Mamba-2; rope_dim: the dims of each
    q/k head rotated (None: all; fewer: `attn.variants.partial_rope`, adjacent pairs with
    rope_pairs, else halves); out_gate: each q head's rows followed by its output gate's
    (qwen35: the attention's output times sigmoid(gate), `sigmoid_gate`). ffn: the FFN
    layers' width (any positive value where no layer has one); act: the gated FFNs'."""

    def __init__(
        self, layers: list[LayerSpec], hidden: int, n_heads: int, n_kv: int, head_dim: int,
        ffn: int, eps: float, attn_scale: float, act: str, res_scale: float = 1.0,
        lanes: int | None = None, rope_dim: int | None = None, rope_pairs: bool = False,
        out_gate: bool = False,
    ) -> None:  # fmt: skip
        self._lib = bind(_SIGNATURES)
        self._specs = layers  # keeps every pointed-to tensor alive
        arr = (_Layer * len(layers))()
        self._mambas = [None if L.mamba is None else L.mamba.c_struct() for L in layers]
        self._gdns = [None if L.gdn is None else L.gdn.c_struct() for L in layers]
        self._convs = [None if L.conv is None else L.conv.c_struct() for L in layers]
        # the recurrent layers (Mamba-2, delta-net, short conv): decode steps alone, with
        # state records
        self.mamba_layers = [i for i, L in enumerate(layers) if L.recurrent is not None]
        mixers = [L.recurrent for L in layers]
        self._state_sizes = [m.state_size for m in mixers if m is not None]  # each one's record
        self._attends = [L.attends for L in layers]
        self.rope_dim = head_dim if rope_dim is None else rope_dim
        if not (2 <= self.rope_dim <= head_dim and self.rope_dim % 2 == 0):
            raise ValueError(f"fused layers: rope on {self.rope_dim} of {head_dim} dims")
        if any(L.mamba for L in layers) and lanes is None:
            self._lib = None  # the Mamba-2 step needs torch's sum width: the Python path
        for i, L in enumerate(layers):
            check_layer(i, L, hidden, n_heads, n_kv, head_dim, ffn, out_gate)
            arr[i].norm_n = (_I * 5)(*[numel(t) for t in (L.attn_norm, L.qk_norm,
                                       L.post_attn_norm, L.ffn_norm, L.post_ffn_norm)])  # fmt: skip
            arr[i].qkv, arr[i].o = proj_struct(L.qkv), proj_struct(L.o)
            arr[i].gate_up, arr[i].down = proj_struct(L.gate_up), proj_struct(L.down)
            arr[i].ssm_in, arr[i].ssm_out = proj_struct(L.ssm_in), proj_struct(L.ssm_out)
            arr[i].beside = L.ssm_in is not None
            arr[i].attn_norm, arr[i].qk_norm = ptr(L.attn_norm), ptr(L.qk_norm)
            arr[i].post_attn_norm, arr[i].ffn_norm = ptr(L.post_attn_norm), ptr(L.ffn_norm)
            arr[i].post_ffn_norm, arr[i].sliding = ptr(L.post_ffn_norm), int(L.sliding)
            arr[i].rope, arr[i].ffn_form, arr[i].no_mixer = L.rope, L.ffn_form, L.qkv is None
            mb, gd, cv = self._mambas[i], self._gdns[i], self._convs[i]
            arr[i].mamba = None if mb is None else ctypes.addressof(mb)
            arr[i].gdn = None if gd is None else ctypes.addressof(gd)
            arr[i].conv = None if cv is None else ctypes.addressof(cv)
        self._layers = arr
        self._model = _Model(len(layers), hidden, n_heads, n_kv, head_dim, ffn, eps,
                             attn_scale, ACTS.get(act, 0), ctypes.addressof(arr), res_scale,
                             lanes or 0, self.rope_dim, int(rope_pairs),
                             int(out_gate))  # fmt: skip
        self.out_gate = out_gate
        self.hidden, self.n_kv, self.head_dim = hidden, n_kv, head_dim
        self._kv_key: list[int] = []
        self._kv: tuple[Any, Any] | None = None
        # the LoRA slot of each target name: (layer * PROJS + projection) * 8 + part
        self._slots = {
            name: (_PROJS * i + j) * 8 + k
            for i, L in enumerate(layers)
            for j, p in enumerate(L.projections)
            if p is not None
            for k, name in enumerate(p.names)
        }
        self._adapters: dict[Hashable, tuple[Any, list[torch.Tensor]]] = {}

        # each target's (input width, rows): the LoRA pairs are checked against them
        def widths(L: LayerSpec) -> tuple[int, ...]:
            w_in, _, w_mid = mixer_widths(L, hidden, n_heads, n_kv, head_dim, out_gate)
            side = (0, 0, 0) if L.mamba is None else mamba_widths(L.mamba, hidden)
            return w_in, w_mid, hidden, ffn, side[0], side[2]

        self._dims = {
            name: (widths(L)[j], raw.shape[0])
            for L in layers
            for j, p in enumerate(L.projections)
            if p is not None
            for name, (raw, _, _) in zip(p.names, p.parts, strict=False)
        }

    def adapter_targets(self, key: Hashable, weights: Mapping[str, Any]) -> Any:
        """An adapter's targets as the C call reads them (built once per ``key``, e.g. the
        adapter's id); weights: target name -> a `lora.weight.LoraWeight` (float32 ``a``
        [r, in] and ``b`` [out, r], or its halves alone: ``a16``, ``bt16``, ``tail16``) with
        its ``factor``. Targets outside the layers (the output projection) are left to the
        caller."""
        if key not in self._adapters:
            arr = (_LoraW * (len(self._specs) * _PROJS * 8))()
            keep: list[torch.Tensor] = []
            for name, w in weights.items():
                slot = self._slots.get(name)
                if slot is None:
                    continue
                n_in, n_out = self._dims[name]
                a16, bt16, tail16 = (getattr(w, k, None) for k in ("a16", "bt16", "tail16"))
                if a16 is not None and bt16 is not None and tail16 is not None:
                    r = a16.shape[0]
                    if not (halves(a16, (r, n_in)) and halves(bt16, (n_out // 8, r, 8))
                            and halves(tail16, (n_out % 8, r)) and r >= 1):  # fmt: skip
                        raise ValueError(
                            f"LoRA for {name!r}: A {tuple(a16.shape)}, B tiles "
                            f"{tuple(bt16.shape)} and tail {tuple(tail16.shape)} do not fit "
                            f"its [{n_out}, {n_in}] weight"
                        )
                    keep += [a16, bt16, tail16]  # its halves alone: ls_lora16, the same bits
                    arr[slot] = _LoraW(None, None, r, float(w.factor), None, n_in, n_out,
                                       a16.data_ptr(), bt16.data_ptr(),
                                       tail16.data_ptr() if tail16.numel() else None)  # fmt: skip
                    continue
                a, b = w.a.float().contiguous(), w.b.float().contiguous()
                if a.dim() != 2 or b.dim() != 2 or a.shape[1] != n_in or b.shape[0] != n_out \
                        or a.shape[0] != b.shape[1] or a.shape[0] < 1:  # fmt: skip
                    raise ValueError(
                        f"LoRA for {name!r}: A {tuple(a.shape)} and B {tuple(b.shape)} do not "
                        f"fit its [{n_out}, {n_in}] weight"
                    )
                bt = b.t().contiguous()  # [r, out]: ls_lora's faster route, the same bits
                keep += [a, b, bt]
                arr[slot] = _LoraW(a.data_ptr(), b.data_ptr(), a.shape[0], float(w.factor),
                                   bt.data_ptr(), n_in, n_out)  # fmt: skip
            self._adapters[key] = (arr, keep)
        return self._adapters[key][0]

    @property
    def cached_adapters(self) -> int:
        """How many adapters' targets are cached."""
        return len(self._adapters)

    def retain(self, keys: set[Hashable]) -> None:
        """Forget every adapter whose key is not in ``keys`` (unloaded ones)."""
        for k in [k for k in self._adapters if k not in keys]:
            del self._adapters[k]

    @property
    def available(self) -> bool:
        """Whether the C library is here (otherwise the caller runs its Python path)."""
        return self._lib is not None

    def _kv_arrays(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[Any, Any]:
        key = [t.data_ptr() for pair in kv for t in pair]  # the pools moved: new arrays
        if key != self._kv_key or self._kv is None:
            pool = (kv[0][0].shape[0], self.n_kv, self.head_dim)  # checked once per pool
            for i, (k, v) in enumerate(kv):
                if not self._attends[i]:  # no keys there (the C call never reads its pool)
                    continue
                if tuple(k.shape) != pool or tuple(v.shape) != pool or not k.is_contiguous() \
                        or not v.is_contiguous() or k.dtype != torch.float32 \
                        or v.dtype != torch.float32:  # fmt: skip
                    raise ValueError(f"fused layers: a KV pool is not [S, {pool[1]}, {pool[2]}]")
            n = len(kv)
            self._kv = ((_P * n)(*[k.data_ptr() for k, _ in kv]),
                        (_P * n)(*[v.data_ptr() for _, v in kv]))  # fmt: skip
            self._kv_key = key
        return self._kv

    def _state_arrays(self, states: tuple[list[Any], list[Any]] | None, t: int) -> Any:
        """The recurrent layers' state records as the C call's two pointer arrays (None
        without recurrent layers); ValueError where one is missing or of another size."""
        if not self.mamba_layers:
            return None
        n = len(self._specs) * t
        if states is None or len(states[0]) != n or len(states[1]) != n:
            raise ValueError(f"fused layers: recurrent layers need {n} state records each way")
        arrays = []
        for recs in states:
            ptrs: list[int | None] = [None] * n
            for i, size in zip(self.mamba_layers, self._state_sizes, strict=True):
                for q in range(i * t, i * t + t):
                    r = recs[q]
                    if r is None or r.dtype is not _F32 or r.numel() != size \
                            or not r.is_contiguous():  # fmt: skip
                        raise ValueError(f"fused layers: layer {i} needs contiguous float32 "
                                         f"state records of {size} values")  # fmt: skip
                    ptrs[q] = r.data_ptr()
            arrays.append((_P * n)(*ptrs))
        return arrays

    def __call__(self, x: torch.Tensor, slot_mapping: torch.Tensor, slots: torch.Tensor,
                 seq_off: torch.Tensor, row_seq: torch.Tensor, row_nkeys: torch.Tensor,
                 window: int, rope_global: tuple[torch.Tensor, torch.Tensor],
                 rope_local: tuple[torch.Tensor, torch.Tensor],
                 kv: list[tuple[torch.Tensor, torch.Tensor]],
                 lora: tuple[list[Any], torch.Tensor] | None = None,
                 states: tuple[list[Any], list[Any]] | None = None) -> torch.Tensor:  # fmt: skip
        """x [T, hidden] float32 contiguous, updated in place through every layer.
        slot_mapping [T] long; slots/seq_off/row_seq/row_nkeys as `attention` takes them;
        rope tables ([T, D/2] cos, sin) per layer kind; kv: per layer (k, v) pools
        [S, Hkv, D] float32 contiguous; lora: the step's adapters (`adapter_targets` of
        each, ascending id) and their scale table [n, T] float32 (0 where a row's mix lacks
        the adapter); states: where layers are recurrent, each row's sequence's state record
        before and after its row (row q the one new row of its sequence), lists of
        [n_layers * T] contiguous float32 tensors, entry i * T + q (None at the others).
        Raises ValueError on inconsistent metadata."""
        if len(kv) != len(self._specs):
            raise ValueError(f"{len(kv)} KV pools for {len(self._specs)} layers")
        t = x.shape[0]
        if x.dim() != 2 or x.shape[1] != self.hidden or x.dtype != torch.float32 \
                or not x.is_contiguous():  # fmt: skip
            raise ValueError(f"fused layers: x {tuple(x.shape)} {x.dtype}, not [T, {self.hidden}]")
        for c in (*rope_global, *rope_local):
            if c.shape != (t, self.rope_dim // 2) or not c.is_contiguous():
                raise ValueError(f"fused layers: rope tables {tuple(c.shape)} for {t} rows")
        if slot_mapping.numel() != t or row_seq.numel() != t or row_nkeys.numel() != t:
            raise ValueError("fused layers: slot_mapping, row_seq, row_nkeys need T entries")
        slot_mapping, slots = _as(slot_mapping, _LONG), _as(slots, _LONG)
        seq_off, row_seq, row_nkeys = _as(seq_off, _LONG), _as(row_seq, _I32), _as(row_nkeys, _I32)
        (cg, sg), (cl, sl) = rope_global, rope_local
        ks, vs = self._kv_arrays(kv)
        st = self._state_arrays(states, t)
        lo = None
        if lora is not None and lora[0]:
            arrays, table = lora
            table = _as(table, _F32)
            if table.shape != (len(arrays), x.shape[0]):
                raise ValueError(f"LoRA table {tuple(table.shape)} for {len(arrays)} adapters")
            ads = (_P * len(arrays))(*[ctypes.addressof(a) for a in arrays])
            lo = _Lora(len(arrays), table.data_ptr(), ctypes.addressof(ads))
        step = _Step(slot_mapping.data_ptr(), slots.data_ptr(), seq_off.data_ptr(),
                     seq_off.numel() - 1, row_seq.data_ptr(), row_nkeys.data_ptr(), window,
                     cg.data_ptr(), sg.data_ptr(), cl.data_ptr(), sl.data_ptr(),
                     ctypes.addressof(ks), ctypes.addressof(vs), kv[0][0].shape[0],
                     None if lo is None else ctypes.addressof(lo),
                     None if st is None else ctypes.addressof(st[0]),
                     None if st is None else ctypes.addressof(st[1]))  # fmt: skip
        rc = self._lib.ls_decoder_layers(
            ctypes.byref(self._model), ctypes.byref(step), x.data_ptr(), x.shape[0],
            torch.get_num_threads(),
        )  # fmt: skip
        if rc == -2:
            raise MemoryError("fused layers: out of memory for the step's buffers")
        if rc == -3:
            raise ValueError("fused layers: a projection, norm or adapter of another width")
        if rc != 0:
            raise ValueError("fused layers: inconsistent step metadata or a refused type")
        return x
