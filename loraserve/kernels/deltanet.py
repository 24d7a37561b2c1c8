"""The gated delta rule's per-token recurrence in C (`deltanet.c`), for
`model.recurrent.deltanet`: one call runs every sequence of a step, each (sequence, value
head) in parallel, with the torch reference's float operations in its order; the gates of
every path (`gdn_gates`) and a decode step's whole mixer between its projections
(`gdn_step`, `deltanet_step.h`)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from loraserve.cbuild import lazy_bind
from loraserve.kernels import argcheck, gdn_chunk
from loraserve.kernels.argcheck import int64s, pointers
from loraserve.kernels.layers_abi import GdnC

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "ls_gdn_recur": (
        [_I, _P, _P, _P, _P, _P, _P, _P, _I, _P, _P, _F, _P, _I, _I, _P, _P, _P, ctypes.c_int],
        ctypes.c_int,
    ),
    "ls_conv_step": ([_P, _P, _P, _P, _I, _I, _P, _P, _P, _P], ctypes.c_int),
    "ls_gdn_gates": ([_P, _I, _I, _I, _P, _P, _P, _P, _P], ctypes.c_int),
    "ls_gdn_step": ([_P, _I, _I, _P, _P, _P, _P, ctypes.c_int], ctypes.c_int),
}
_c = lazy_bind(_SIGNATURES)


def available() -> bool:
    """Whether the C kernel is built and loaded here."""
    return _c() is not None


def gdn_recur(
    spans: Sequence[tuple[int, int]],
    m_in: Sequence[torch.Tensor],
    m_out: Sequence[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    o: torch.Tensor,
    snaps: Sequence[Sequence[tuple[int, torch.Tensor]]],
) -> None:
    """Run sequence z's rows ``spans[z]`` = (lo, hi) from state ``m_in[z]`` [H, S, S] (read
    only) into ``m_out[z]``: q, k [T, H, S] and o (written) contiguous, v [T, H, S] with heads
    contiguous (any row stride), g, beta [T, H] contiguous; ``snaps[z]`` lists (row r from lo,
    ascending; tensor [H, S, S] to receive the state after it). Every tensor float32, every
    state contiguous. Raises RuntimeError when the kernel is not built or runs out of memory."""
    lib = _c()
    if lib is None:
        raise RuntimeError("the delta-net C kernel is not built here")
    if q.dim() != 3:
        raise ValueError(f"gdn_recur: q {tuple(q.shape)}, expected [T, H, S]")
    t, h, s = q.shape
    for x, shape in ((q, (t, h, s)), (k, (t, h, s)), (o, (t, h, s)), (g, (t, h)), (beta, (t, h))):
        argcheck.f32(f"gdn_recur: a tensor of shape {tuple(x.shape)}", x, shape=shape)
    argcheck.f32("gdn_recur: v", v, shape=(t, h, s), contiguous=False)
    if v.stride()[1:] != (s, 1):
        raise ValueError(f"gdn_recur: v {tuple(v.shape)} strides {v.stride()}")
    for x in (*m_in, *m_out, *(d for z in snaps for _, d in z)):
        argcheck.f32(f"gdn_recur: every state must be {h * s * s} contiguous float32", x, h * s * s)
    argcheck.spans("gdn_recur", spans, t, m_in, m_out, snaps)
    off = [0]
    for z in snaps:
        off.append(off[-1] + len(z))
    rows = [r for z in snaps for r, _ in z]
    rc = lib.ls_gdn_recur(
        len(spans), int64s([lo for lo, _ in spans]), int64s([hi - lo for lo, hi in spans]),
        pointers(m_in), pointers(m_out), q.data_ptr(), k.data_ptr(), v.data_ptr(), v.stride(0),
        g.data_ptr(), beta.data_ptr(), scale, o.data_ptr(), h, s, int64s(off), int64s(rows),
        pointers([d for z in snaps for _, d in z]), torch.get_num_threads(),
    )  # fmt: skip
    if rc == -3:
        raise ValueError("gdn_recur: spans or snapshot rows that do not fit the C kernel")
    if rc != 0:
        raise RuntimeError("gdn_recur: out of memory for its work buffers")


def conv_step(
    st: torch.Tensor,
    x: torch.Tensor,
    taps: torch.Tensor,
    bias: torch.Tensor | None,
    ones: torch.Tensor,
    conv_out: torch.Tensor,
) -> torch.Tensor:
    """One row of a recurrent layer's causal depthwise conv, then SiLU (a decode step of the
    delta-net and Mamba-2 mixers): st [(L-1) C] the state's conv rows, x [C] the new row,
    taps [L, C], bias [C] or None, ones [C] of 1.0; writes the conv rows after this row into
    conv_out [(L-1) C] and returns SiLU(conv) [1, C]: the bits of `shortconv.causal_conv`
    (+ bias) and `rowops.gated_act(pre, 1, "silu")` on the padded rows. Every tensor float32
    and contiguous (x: its C values in a row)."""
    lib = _c()
    if lib is None:
        raise RuntimeError("the delta-net C kernel is not built here")
    if taps.dim() != 2:
        raise ValueError(f"conv_step: taps {tuple(taps.shape)}, expected [L, C]")
    n, c = taps.shape
    if x.numel() != c or st.numel() != (n - 1) * c or conv_out.numel() != (n - 1) * c:
        raise ValueError(f"conv_step: state {st.numel()}, row {x.numel()} for taps {(n, c)}")
    argcheck.f32("conv_step: x", x, c, contiguous=False)
    if x.stride(-1) != 1 or not (st.is_contiguous() and conv_out.is_contiguous()):
        raise ValueError("conv_step: rows of unit stride")
    for what, y, m in (("st", st, None), ("conv_out", conv_out, None), ("taps", taps, None),
                       ("bias", bias, c), ("ones", ones, c)):  # fmt: skip
        argcheck.f32(f"conv_step: {what}", y, m)
    pre, act = torch.empty(c), torch.empty(1, c)
    rc = lib.ls_conv_step(st.data_ptr(), x.data_ptr(), taps.data_ptr(),
                          None if bias is None else bias.data_ptr(), c, n, ones.data_ptr(),
                          pre.data_ptr(), act.data_ptr(), conv_out.data_ptr())  # fmt: skip
    if rc != 0:
        raise ValueError(f"conv_step: sizes that do not fit the C kernel ({rc})")
    return act


def gdn_gates(
    ba: torch.Tensor, cols: torch.Tensor, dt_b: torch.Tensor, a: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """g = exp(softplus(alpha + dt_b) a) and beta = sigmoid(beta logit), [T, H] each, of the
    rows ba [T, W] (unit stride; value head h's beta logit at column cols[h], its alpha at
    cols[H + h], cols int64 [2 H]), each value alone in libm (`deltanet_step.h`): the bits of
    every delta-net path, in any layout."""
    lib = _c()
    if lib is None:
        raise RuntimeError("the delta-net C kernel is not built here")
    argcheck.rows("gdn_gates: ba", ba, 1)
    t, w = ba.shape
    h = dt_b.numel()
    if cols.numel() != 2 * h or cols.dtype != torch.int64 or cols.device.type != "cpu" \
            or a.numel() != h:  # fmt: skip
        raise ValueError(f"gdn_gates: rows {tuple(ba.shape)}, {cols.numel()} columns, {h} heads")
    if h and not 0 <= int(cols.min()) <= int(cols.max()) < w:  # C knows the stride, not w
        raise ValueError(f"gdn_gates: columns {cols.tolist()} outside rows of {w}")
    cols, dt_b, a = cols.contiguous(), dt_b.contiguous(), a.contiguous()
    argcheck.f32("gdn_gates: dt_b", dt_b, h)
    argcheck.f32("gdn_gates: a", a, h)
    g, beta = torch.empty(t, h), torch.empty(t, h)
    rc = lib.ls_gdn_gates(ba.data_ptr(), ba.stride(0) if t > 1 else w, t, h, cols.data_ptr(),
                          dt_b.data_ptr(), a.data_ptr(), g.data_ptr(), beta.data_ptr())  # fmt: skip
    if rc != 0:
        raise ValueError(f"gdn_gates: columns {cols.tolist()} outside rows of {w}")
    return g, beta


def gdn_step(
    mixed: torch.Tensor,
    st_in: Sequence[torch.Tensor],
    st_out: Sequence[torch.Tensor],
    spec: ctypes.Structure,
    state_size: int,
) -> torch.Tensor:
    """A decode step of a delta-net mixer between its projections: mixed [T, W] float32 (unit
    stride: q|k|v, z, beta|alpha), row q the one new row of its sequence, whose state record
    st_in[q] is read and st_out[q] written (``state_size`` contiguous float32 each); spec:
    the mixer's `layers_spec.GdnSpec.c_struct`. Returns the out-projection's input
    [T, Hv S]."""
    lib = _c()
    if lib is None:
        raise RuntimeError("the delta-net C kernel is not built here")
    if not isinstance(spec, GdnC) or min(spec.Hk, spec.Hv, spec.S) < 1 or spec.L < 2:
        raise ValueError("gdn_step: spec must be a GdnSpec's c_struct()")
    hk, hv, s, n, ch = spec.Hk, spec.Hv, spec.S, spec.L, spec.chunk
    c = 2 * hk * s + hv * s
    if state_size != (n - 1) * c + gdn_chunk.scan_size(hv, s, ch):  # what C writes into each
        raise ValueError(f"gdn_step: state_size {state_size} is not the spec's")
    argcheck.rows("gdn_step: mixed", mixed, c + hv * s + 2 * hv)
    t = mixed.shape[0]
    if len(st_in) != t or len(st_out) != t:
        raise ValueError(f"gdn_step: rows {tuple(mixed.shape)} for {len(st_in)} states")
    for x in (*st_in, *st_out):
        argcheck.f32(f"gdn_step: every state must be {state_size} contiguous float32", x,
                     state_size)  # fmt: skip
    out = torch.empty(t, hv * s)
    rc = lib.ls_gdn_step(mixed.data_ptr(), mixed.stride(0) if t > 1 else mixed.shape[1], t,
                         pointers(st_in), pointers(st_out), ctypes.addressof(spec), out.data_ptr(),
                         torch.get_num_threads())  # fmt: skip
    if rc == -2:
        raise MemoryError("gdn_step: out of memory for its work buffers")
    if rc == -4:
        raise ValueError("gdn_step: a corrupt chunked record (its pending-row count)")
    if rc != 0:
        raise ValueError(f"gdn_step: sizes that do not fit the C kernel ({rc})")
    return out
