"""The selective scans of Mamba-2 and Mamba-1 in C (`ssm_scan.c`): one call per layer per
step, bit-identical to the per-token torch loops of ``model/recurrent/mamba2.py`` and
``mamba1.py`` (which stay as the fallback and the tests' reference); and a Mamba-2 decode step
from its in-projection's output to its out-projection's input in one call (`mamba2_step`).

The C code sums y = sum_n s C in the order torch's float sum uses with its vector width, so
it runs only where a width reproduces torch's sums (`vector_lanes`). Mamba-2's step sizes
(softplus and exp) are computed value by value in libm (`dt_da`), so the fused C layers
(`kernels.layers`) compute the very same ones; Mamba-1's stay torch's, computed in a layout
whose every row gets the bits it gets alone (`softplus_rows`)."""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from loraserve.cbuild import bind
from loraserve.kernels import argcheck

_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "ls_ssm_scan2": ([_P, _I, _P, _P] + [_I] * 5 + [_P] * 8 + [ctypes.c_int] * 2, ctypes.c_int),
    "ls_ssm_rowsum": ([_P, _I, _I, ctypes.c_int, _P], ctypes.c_int),
    "ls_mamba2_step": (
        [_P, _I, _P, _P, _I]
        + [_P] * 7
        + [ctypes.c_float]
        + [_I] * 5
        + [_P, ctypes.c_int, ctypes.c_int],
        ctypes.c_int,
    ),
    "ls_ssm_dt": ([_P, _I, _I, _I, _P, _P, _P, _P], ctypes.c_int),
    "ls_ssm_scan1": (
        [_P] * 5 + [_I] * 3 + [_P, _P, _I, _I] + [_P] * 5 + [ctypes.c_int] * 2,
        ctypes.c_int,
    ),
}
_lib: ctypes.CDLL | None = None
_loaded = False
_lanes: int | None = 0  # 0: not probed yet
_GRAIN = 32768  # torch's parallel grain: a smaller elementwise op runs on one thread


def _c() -> ctypes.CDLL | None:
    global _lib, _loaded
    if not _loaded:
        _lib, _loaded = bind(_SIGNATURES), True
    return _lib


def vector_lanes() -> int | None:
    """The lane count with which the C sum reproduces torch's float sum here (8 on x86
    builds of torch, AVX-512 ones included), found once by summing probe rows both ways;
    None where no width matches or the library is missing (then the scans stay in torch)."""
    global _lanes
    if _lanes == 0:
        _lanes = None
        lib = _c()
        if lib is not None:
            gen = torch.Generator().manual_seed(0)
            probes = [torch.randn(64, k, generator=gen) for k in (3, 7, 13, 16, 64, 200, 1100)]
            for vl in (8, 16, 4):
                ok = True
                for v in probes:
                    out = torch.empty(v.shape[0])
                    _ok(lib.ls_ssm_rowsum(v.data_ptr(), v.shape[0], v.shape[1], vl,
                                          out.data_ptr()), "ssm_rowsum")  # fmt: skip
                    ok = ok and torch.equal(out, v.sum(-1))
                if ok:
                    _lanes = vl
                    break
    return _lanes


def available() -> bool:
    """Whether the C scans can run here (library built, torch's vector width known)."""
    return _c() is not None and vector_lanes() is not None


def _ok(rc: int, what: str) -> None:
    """A C entry point's refusal (-3: sizes that do not fit, issue 31) as an exception;
    -2: out of memory for its work buffers."""
    if rc == -2:
        raise MemoryError(f"{what}: out of memory for its work buffers")
    if rc != 0:
        raise ValueError(f"{what}: sizes that do not fit the C kernel ({rc})")


def softplus_rows(x: torch.Tensor) -> torch.Tensor:
    """softplus of each row of x [T, K] -> [T, K], each row bitwise what ``F.softplus(x[r])``
    gives alone: torch vectorizes a contiguous run and finishes its tail with the scalar
    formula, so the rows are run from a buffer with a gap after each (never coalesced) in
    blocks under torch's parallel grain (never split mid-row)."""
    t, k = x.shape
    if t == 1 and x.is_contiguous():  # the row alone already (a decode step): one op
        return F.softplus(x)
    buf = torch.empty(t, k + 1)
    buf[:, :k] = x
    out = torch.empty(t, k)
    step = max(1, _GRAIN // max(k, 1))
    for r in range(0, t, step):
        out[r : r + step] = F.softplus(buf[r : r + step, :k])
    return out


def dt_da(raw: torch.Tensor, bias: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Mamba-2's step sizes from raw [T, H] (float32, unit stride; e.g. a column range of
    the in-projection's output), bias and a [H] contiguous: (dt, da) [T, H] with dt =
    softplus(raw + bias) and da = exp(dt a), each value alone in libm (`ls_ssm_dt`), the
    same bits in any batch, chunking or layout."""
    lib = _c()
    if lib is None:
        raise RuntimeError("the C selective scan is not available here")
    argcheck.rows("dt_da: raw", raw, 1)
    t, h = raw.shape
    if bias.numel() != h or a.numel() != h:
        raise ValueError("dt_da: raw must be float32 rows of unit stride, bias and a [H]")
    bias, a = bias.contiguous(), a.contiguous()
    argcheck.f32("dt_da: bias", bias, h)
    argcheck.f32("dt_da: a", a, h)
    dt, da = torch.empty(t, h), torch.empty(t, h)
    _ok(lib.ls_ssm_dt(raw.data_ptr(), raw.stride(0) if t > 1 else h, t, h, bias.data_ptr(),
                      a.data_ptr(), dt.data_ptr(), da.data_ptr()), "ssm_dt")  # fmt: skip
    return dt, da


def _index(spans: list[tuple[int, int]], wanted: list[list[int]]) -> tuple[torch.Tensor, ...]:
    if spans == [(0, 1)] and wanted == [[]]:  # a decode step of one sequence: made once
        if _ONE_ROW[0] is None:
            _ONE_ROW[0] = _make_index(spans, wanted)
        return _ONE_ROW[0]
    return _make_index(spans, wanted)


_ONE_ROW: list[tuple[torch.Tensor, ...] | None] = [None]  # the kernel only reads them


def _make_index(spans: list[tuple[int, int]], wanted: list[list[int]]) -> tuple[torch.Tensor, ...]:
    lo = torch.tensor([a for a, _ in spans], dtype=torch.int64)
    hi = torch.tensor([b for _, b in spans], dtype=torch.int64)
    rows = [a + r for (a, _), w in zip(spans, wanted, strict=True) for r in w]
    snap_rows = torch.tensor(rows, dtype=torch.int64)
    off = [0]
    for w in wanted:
        off.append(off[-1] + len(w))
    return lo, hi, snap_rows, torch.tensor(off, dtype=torch.int64)


def scan2(
    xbc: torch.Tensor,
    dt: torch.Tensor,
    da: torch.Tensor,
    dims: tuple[int, int, int, int],
    spans: list[tuple[int, int]],
    states: list[torch.Tensor],
    wanted: list[list[int]],
    finals: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mamba-2 scan: xbc [T, >= H P + 2 G N] (rows x [H, P], B, C [G, N]; float32, unit
    stride), dt, da [T, H], dims (H, P, N, G); sequence q owns rows spans[q] and starts from
    states[q] [H, P, N] (not modified); wanted[q]: its local rows (ascending) whose state to
    keep. ``finals``: a contiguous [nseq, H, P, N] buffer the final states are written to
    (the caller's state record, saving a copy per step), else a new one.
    -> (y [T, H, P], final states [nseq, H, P, N], snapshots [sum wanted, H, P, N])."""
    lib = _c()
    lanes = vector_lanes()
    if lib is None or lanes is None:
        raise RuntimeError("the C selective scan is not available here")
    h, p, n, g = dims
    if min(dims) < 1:
        raise ValueError(f"scan2: dims {dims}")
    argcheck.rows("scan2: xbc must be float32 rows of unit stride", xbc, h * p + 2 * g * n)
    t = xbc.shape[0]
    argcheck.spans("scan2", spans, t, states, wanted)
    dt, da = dt.contiguous(), da.contiguous()
    argcheck.f32("scan2: dt", dt, shape=(t, h))
    argcheck.f32("scan2: da", da, shape=(t, h))
    if finals is None:
        finals = torch.empty(len(states), h, p, n)
    elif not finals.is_contiguous() or finals.shape != (len(states), h, p, n) \
            or finals.dtype != torch.float32:  # fmt: skip
        raise ValueError("scan2: finals must be a contiguous [nseq, H, P, N] buffer")
    for st in states:
        argcheck.f32("scan2: each state must be contiguous float32 [H, P, N]", st, h * p * n)
    # the kernel copies each starting state into finals head by head, as it scans
    s_in = (ctypes.c_void_p * len(states))(*(st.data_ptr() for st in states))
    s = finals
    lo, hi, snap_rows, off = _index(spans, wanted)
    snaps = torch.empty(len(snap_rows), h, p, n)
    y = torch.empty(t, h, p)
    _ok(lib.ls_ssm_scan2(
        xbc.data_ptr(), xbc.stride(0), dt.data_ptr(), da.data_ptr(), h, p, n, g, len(spans),
        lo.data_ptr(), hi.data_ptr(), s.data_ptr(), ctypes.addressof(s_in), snap_rows.data_ptr(),
        off.data_ptr(),
        snaps.data_ptr(), y.data_ptr(), lanes, torch.get_num_threads(),
    ), "ssm_scan2")  # fmt: skip
    return y, s, snaps


def scan1(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    spans: list[tuple[int, int]],
    states: list[torch.Tensor],
    wanted: list[list[int]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mamba-1 scan: x, dt [T, D] (dt before softplus), a [D, N], b, c [T, N]; spans,
    states [D, N] and wanted as `scan2`. dA = exp(softplus(dt) A) is built in blocks of rows
    (torch's exp gives each value the same bits in any layout). -> (y [T, D], final states
    [nseq, D, N], snapshots [sum wanted, D, N])."""
    lib = _c()
    lanes = vector_lanes()
    if lib is None or lanes is None:
        raise RuntimeError("the C selective scan is not available here")
    if x.dim() != 2 or a.dim() != 2:
        raise ValueError(f"scan1: x {tuple(x.shape)}, a {tuple(a.shape)}")
    t, d = x.shape
    n = a.shape[1]
    x, b, c, a = x.contiguous(), b.contiguous(), c.contiguous(), a.contiguous()
    for what, y, shape in (("x", x, (t, d)), ("dt", dt, (t, d)), ("a", a, (d, n)),
                           ("b", b, (t, n)), ("c", c, (t, n))):  # fmt: skip
        argcheck.f32(f"scan1: {what}", y, shape=shape, contiguous=False)
    argcheck.spans("scan1", spans, t, states, wanted)
    for st in states:
        argcheck.f32("scan1: each state must be float32 [D, N]", st, d * n, contiguous=False)
    dts = softplus_rows(dt)  # [T, D]
    s = torch.stack([st.reshape(d, n) for st in states]) if states else torch.empty(0)
    lo, hi, snap_rows, off = _index(spans, wanted)
    snaps = torch.empty(len(snap_rows), d, n)
    y = torch.empty(t, d)
    step = max(1, (1 << 20) // max(d * n, 1))
    for r0 in range(0, t, step):
        r1 = min(t, r0 + step)
        da = torch.exp(dts[r0:r1].view(-1, d, 1) * a)  # [rows, D, N]
        _ok(lib.ls_ssm_scan1(
            x.data_ptr(), dts.data_ptr(), da.data_ptr(), b.data_ptr(), c.data_ptr(), d, n,
            len(spans), lo.data_ptr(), hi.data_ptr(), r0, r1, s.data_ptr(),
            snap_rows.data_ptr(), off.data_ptr(), snaps.data_ptr(), y.data_ptr(), lanes,
            torch.get_num_threads(),
        ), "ssm_scan1")  # fmt: skip
    return y, s, snaps


def mamba2_step(
    zx: torch.Tensor,
    dt: torch.Tensor,
    da: torch.Tensor,
    dims: tuple[int, int, int, int, int],
    st_in: list[torch.Tensor],
    st_out: list[torch.Tensor],
    weights: tuple[
        torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor | None
    ],
    eps: float,
) -> torch.Tensor:
    """A Mamba-2 mixer's decode step between its projections (`mamba2_step.c`): row q of zx
    [T, >= 2 H P + 2 G N] (z, xBC, ...; float32, unit stride) is the one new row of the
    sequence whose state record is st_in[q] [(L-1) C + H P N]; its record after the row is
    written into st_out[q] (same size, other memory). dt, da [T, H] (softplus(dt + bias),
    exp(dt A)); dims (L, H, P, N, G); weights (taps [L, C], conv bias [C] or None, ones [C],
    D [H], grouped norm [G, H P / G] or None). -> [T, H P], the out-projection's input: the
    bits of `Mamba2.forward`'s general path on the same rows."""
    lib, lanes = _c(), vector_lanes()
    if lib is None or lanes is None:
        raise RuntimeError("the C selective scan is not available here")
    k, h, p, n, g = dims
    di = h * p
    taps, conv_b, ones, d, norm = weights
    argcheck.rows("mamba2_step: zx", zx, 2 * di + 2 * g * n)
    t = zx.shape[0]
    if len(st_in) != t or len(st_out) != t:
        raise ValueError("mamba2_step: zx must be float32 rows of unit stride, one state each")
    size = (k - 1) * (di + 2 * g * n) + di * n
    for s in (*st_in, *st_out):
        argcheck.f32(f"mamba2_step: state records of {size} contiguous floats needed", s, size)
    c = di + 2 * g * n
    for w, m in ((taps, k * c), (conv_b, c), (ones, c), (d, h), (norm, di)):
        argcheck.f32("mamba2_step: weights of other sizes than the dims", w, m)
    dt, da = dt.contiguous(), da.contiguous()
    argcheck.f32("mamba2_step: dt", dt, shape=(t, h))
    argcheck.f32("mamba2_step: da", da, shape=(t, h))
    out = torch.empty(t, di)
    ins = (ctypes.c_void_p * t)(*(s.data_ptr() for s in st_in))
    outs = (ctypes.c_void_p * t)(*(s.data_ptr() for s in st_out))
    _ok(lib.ls_mamba2_step(
        zx.data_ptr(), zx.stride(0), dt.data_ptr(), da.data_ptr(), t, ins, outs,
        taps.data_ptr(), None if conv_b is None else conv_b.data_ptr(), ones.data_ptr(),
        d.data_ptr(), None if norm is None else norm.data_ptr(), eps, h, p, n, g, k,
        out.data_ptr(), lanes, torch.get_num_threads(),
    ), "mamba2_step")  # fmt: skip
    return out
