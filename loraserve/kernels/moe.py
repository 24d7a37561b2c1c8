"""Grouped expert matmuls of a mixture-of-experts layer (`moe.c`).

A step's (token, top-k slot) pairs are sorted by expert (`GroupedExperts.route`), so each
expert's rows are one block that the quantized tiles of `kernels.qmatmul` multiply by that
expert's matrices in one parallel region per projection (not one per expert). `ffn` runs
the whole routed FFN in one call; `gate_up`, `act`, `down` and `combine` are its stages
one by one, for steps whose adapters add deltas between them. Both give the same bits: the
same functions in the same order. Each row's numbers depend on that row alone (activation
quantization per row, fixed-order dot products), and `combine` sums a token's k expert
outputs in its top-k slot order, so nothing depends on the batch.

Stacks are read as the kernel type given: ggml rows, rows packed by `kernels.pack_rows`, or
Q6_K rows packed by `kernels.pack_q6k` (``PACKED | 14``, only these kernels read them). The C
side keeps one workspace between calls (up to 64 MB) and unmaps it when the last
`GroupedExperts` is collected (`workspace_bytes` says what it holds).
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import NamedTuple

import torch

from loraserve.cbuild import bind
from loraserve.kernels import PACKED, QUANT_TYPES
from loraserve.kernels.rowops import ACTS

_P, _I, _CI = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


class _Proj(ctypes.Structure):
    """moe.c's ``ls_moe_proj_t``: parts side by side, part i of expert e at ws[i * E + e]."""

    _fields_ = [
        ("nparts", ctypes.c_int32),
        ("types", ctypes.c_int32 * 8),
        ("ws", ctypes.POINTER(ctypes.c_void_p)),
        ("ns", ctypes.c_int64 * 8),
        ("row_bytes", ctypes.c_int64 * 8),
        ("cols", ctypes.c_int64 * 8),
        ("n_out", ctypes.c_int64),
    ]


_PP = ctypes.POINTER(_Proj)
_SIGNATURES = {
    "ls_moe_route": ([_I, _I, _I, _P, _P, _P, _P], _CI),
    "ls_moe_matmul": ([_PP, _I, _P, _I, _P, _I, _I, _P, _P, _P, _CI], _CI),
    "ls_moe_act": ([_P, _I, _P, _I, _P, _P, _CI, _P, _CI], _CI),
    "ls_moe_combine": ([_P, _I, _I, _I, _P, _P, _P, _P, _P, _CI], _CI),
    "ls_moe_ffn": ([_PP, _PP, _I, _I, _I, _P, _I, _I, _P, _P, _CI, _P, _P, _P, _CI, _P, _CI],
                   _CI),
    "ls_moe_release": ([], None),
    "ls_moe_workspace_bytes": ([], _I),
}  # fmt: skip
_lib: ctypes.CDLL | None = None
_loaded = False


def _c() -> ctypes.CDLL | None:
    global _lib, _loaded
    if not _loaded:
        _lib, _loaded = bind(_SIGNATURES), True
    return _lib


# one stacked matrix: each expert's rows [N, row_bytes] uint8 (one type and size), and the
# kernel type they are read as (`PACKED | ggml type` for packed rows)
ExpertStack = tuple[list[torch.Tensor], int]


class Route(NamedTuple):
    """A step's pairs p = t * k + j sorted by expert (ties in pair order)."""

    off: torch.Tensor  # [E + 1] int64: each expert's first sorted row
    pair: torch.Tensor  # [P] int64: the pair at each sorted row
    inv: torch.Tensor  # [P] int64: each pair's sorted row
    tok: torch.Tensor  # [P] int64: the token of each sorted row
    experts: torch.Tensor  # [T, k] int64 contiguous: the routing it sorts


def _kernels() -> ctypes.CDLL:
    lib = _c()
    if lib is None:
        raise RuntimeError("grouped expert matmuls need the C kernels")
    return lib


# the live grouped layers: when the last goes (its model unloaded), the C side's kept
# workspace (up to 64 MB, `moe_buf.h`) is unmapped
_live = 0
_live_lock = threading.Lock()


def _gone() -> None:
    global _live
    with _live_lock:
        _live -= 1
        if _live == 0 and _lib is not None:
            _lib.ls_moe_release()


def workspace_bytes() -> int:
    """Bytes of the workspace the C side keeps between calls (0: none)."""
    lib = _c()
    return 0 if lib is None else int(lib.ls_moe_workspace_bytes())


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(rc: int, what: str) -> None:
    if rc == -2:
        raise MemoryError(f"{what}: out of memory")
    if rc != 0:
        raise ValueError(f"{what}: sizes or types that do not fit ({rc})")


class GroupedExperts:
    """The routed experts of one layer: gate|up stacks side by side (``gate_up``: one fused
    stack of 2F rows, gate first, or a gate and an up stack) and the down stack, with the
    optional biases gate/up [E, F], down [E, H] and the activation ``act`` (`rowops.ACTS`).
    Ungated experts (``gated=False``: nemotron_h_moe's relu^2) give ``gate_up`` the up stack
    alone; they run in stages (`gate_up` [P, F], the caller's activation, `down`, `combine`),
    not by `ffn_rows`."""

    def __init__(
        self,
        gate_up: list[ExpertStack],
        down: ExpertStack,
        act: str,
        gate_bias: torch.Tensor | None = None,
        up_bias: torch.Tensor | None = None,
        down_bias: torch.Tensor | None = None,
        gated: bool = True,
    ) -> None:
        self.n_experts = len(down[0])
        self.hidden = down[0][0].shape[0]
        self.gated = gated
        self.width = sum(s[0][0].shape[0] for s in gate_up)  # gate_up's output columns
        self.ffn = self.width // 2 if gated else self.width
        self.act = ACTS[act] if gated else -1
        self._keep: list[object] = []
        self._gate_up = self._proj(gate_up, self.width)
        self._down = self._proj([down], self.hidden)
        self.biases = tuple(None if b is None else b.float().contiguous()
                            for b in (gate_bias, up_bias, down_bias))  # fmt: skip
        global _live
        with _live_lock:
            _live += 1
        weakref.finalize(self, _gone)

    @staticmethod
    def supports(types: list[int]) -> bool:
        """Whether stacks of these kernel types can run here (quantized, C kernels built)."""
        return _c() is not None and all((t & ~PACKED) in QUANT_TYPES for t in types)

    def _proj(self, stacks: list[ExpertStack], n_out: int) -> _Proj:
        if not 1 <= len(stacks) <= 8 or any(len(m) != self.n_experts for m, _ in stacks):
            raise ValueError("expert stacks: 1 to 8, each with one matrix per expert")
        p = _Proj()
        p.nparts, p.n_out = len(stacks), n_out
        ws = (ctypes.c_void_p * (len(stacks) * self.n_experts))()
        col = 0
        for i, (mats, t) in enumerate(stacks):
            if any(m.shape != mats[0].shape or m.stride(1) != 1 for m in mats):
                raise ValueError("an expert stack's matrices differ in size or are not rows")
            for e, m in enumerate(mats):
                ws[i * self.n_experts + e] = m.data_ptr()
            n, rb = mats[0].shape[0], mats[0].stride(0)
            p.types[i], p.ns[i], p.row_bytes[i], p.cols[i] = t, n, rb, col
            col += n
        if col != n_out:
            raise ValueError(f"expert stacks give {col} output columns, not {n_out}")
        p.ws = ws
        self._keep += [ws, [m for s in stacks for m in s[0]]]
        return p

    def route(self, experts: torch.Tensor) -> Route:
        """experts [T, k] int64 (each in 0..E-1) -> the pairs sorted by expert."""
        experts = experts.contiguous()
        t, k = experts.shape
        off = torch.empty(self.n_experts + 1, dtype=torch.int64)
        pair = torch.empty(t * k, dtype=torch.int64)
        inv = torch.empty(t * k, dtype=torch.int64)
        rc = _kernels().ls_moe_route(t, k, self.n_experts, experts.data_ptr(), off.data_ptr(),
                              pair.data_ptr(), inv.data_ptr())  # fmt: skip
        _check(rc, "expert routing")
        return Route(off, pair, inv, pair // k, experts)

    def gate_up(self, x: torch.Tensor, r: Route, scale: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H] float32 -> [P, 2F] ([P, F] ungated): sorted row s is x[r.tok[s]] (times
        scale[s] [P] float32 when given) through its expert's gate|up."""
        x = x.contiguous()
        y = torch.empty(r.pair.numel(), self.width)
        sc = None if scale is None else scale.contiguous()
        rc = _kernels().ls_moe_matmul(
            ctypes.byref(self._gate_up), self.n_experts, r.off.data_ptr(), self.hidden,
            x.data_ptr(), self.hidden, x.shape[0], r.tok.data_ptr(), _ptr(sc), y.data_ptr(),
            torch.get_num_threads())  # fmt: skip
        _check(rc, "expert gate/up matmul")
        return y

    def act_rows(self, gu: torch.Tensor, r: Route) -> torch.Tensor:
        """gu [P, 2F] (its rows plus the gate/up biases, in place) -> act(gate) * up [P, F]."""
        if not self.gated:
            raise ValueError("ungated experts: the caller applies the activation")
        a = torch.empty(gu.shape[0], self.ffn)
        gb, ub, _ = self.biases
        rc = _kernels().ls_moe_act(gu.data_ptr(), self.n_experts, r.off.data_ptr(), self.ffn,
                                   _ptr(gb), _ptr(ub), self.act, a.data_ptr(),
                                   torch.get_num_threads())  # fmt: skip
        _check(rc, "expert activation")
        return a

    def down(self, a: torch.Tensor, r: Route) -> torch.Tensor:
        """a [P, F] sorted rows -> [P, H] through each row's expert's down matrix."""
        a = a.contiguous()
        y = torch.empty(a.shape[0], self.hidden)
        rc = _kernels().ls_moe_matmul(
            ctypes.byref(self._down), self.n_experts, r.off.data_ptr(), self.ffn, a.data_ptr(),
            self.ffn, a.shape[0], None, None, y.data_ptr(), torch.get_num_threads())  # fmt: skip
        _check(rc, "expert down matmul")
        return y

    def combine(self, d: torch.Tensor, r: Route, weights: torch.Tensor | None) -> torch.Tensor:
        """d [P, H] sorted rows -> [T, H]: each token's rows plus the down bias, times its
        weights [T, k] (None: unweighted), summed in slot order."""
        t, k = r.experts.shape
        out = torch.empty(t, self.hidden)
        w = None if weights is None else weights.float().contiguous()
        rc = _kernels().ls_moe_combine(d.contiguous().data_ptr(), self.hidden, t, k,
                                       r.experts.data_ptr(), r.inv.data_ptr(), _ptr(w),
                                       _ptr(self.biases[2]), out.data_ptr(),
                                       torch.get_num_threads())  # fmt: skip
        _check(rc, "expert combine")
        return out

    def ffn_rows(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                 before: bool = False) -> torch.Tensor:  # fmt: skip
        """The routed FFN in one call: x [T, H] float32, experts [T, k] int64, weights [T, k]
        -> [T, H]; ``before`` (llama4): each expert's input times its weight, its output
        unweighted. The same bits as the stages in turn."""
        if not self.gated:
            raise ValueError("ungated experts run in stages")
        x = x.contiguous()
        experts = experts.contiguous()
        w = weights.float().contiguous()
        t, k = experts.shape
        out = torch.empty(t, self.hidden)
        gb, ub, db = self.biases
        rc = _kernels().ls_moe_ffn(
            ctypes.byref(self._gate_up), ctypes.byref(self._down), self.n_experts, self.hidden,
            self.ffn, x.data_ptr(), t, k, experts.data_ptr(), w.data_ptr(), int(before),
            _ptr(gb), _ptr(ub), _ptr(db), self.act, out.data_ptr(),
            torch.get_num_threads())  # fmt: skip
        _check(rc, "expert FFN")
        return out
