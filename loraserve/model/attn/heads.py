"""Per-head matrices of latent attention (deepseek2's ``attn_k_b`` / ``attn_v_b``) run as one
grouped C call for all heads.

Head j's matrix acts on head j's slice of each token's row, which is the shape of routed
experts with every token routed to every head: the (token, head) pairs sorted head-major
(head j's rows ``j T .. (j + 1) T - 1``, tokens in order) go through `kernels.moe`'s grouped
matmul, whose tiles give each row the same bits as `projection.matmul` on that head's matrix
alone (the same activation quantization per row, the same dot products), in one parallel
region instead of one kernel call per head. Float stacks (float32 precision, F16 files) and
steps with adapters keep the per-head loop (`head_loop`); a head's adapter delta is added to
its rows the same way on either path.

Each head's matrix is repacked 8 rows to a group where its type has packed tiles
(`Matrix.pack`, as the dense projections are), and both paths read the packed rows: V2-Lite's
short rows (``attn_k_b`` Q5_0 [512, 128], ``attn_v_b`` Q4_K [128, 512]) cost 4-5 ns a block
read in place at one token, a decode step's case (1 thread, thread-CPU time: 16 heads 151 and
71 us a layer), several times the packed tiles' time.
"""

from __future__ import annotations

import ctypes

import torch

from loraserve.kernels.moe import _check, _kernels, _Proj
from loraserve.model.context import LoraDelta
from loraserve.model.projection import Matrix, matmul


class HeadStack:
    """H matrices [out, in] of one type and size; ``__call__`` maps x [T, H, >= in] (head j's
    input in its first ``in`` columns, any row stride) to [T, H, out]."""

    def __init__(self, mats: list[Matrix]) -> None:
        mats = [m.pack() for m in mats]  # packed where the type has packed tiles, else as is
        self.mats = mats
        self.n_heads, (self.n_out, self.n_in) = len(mats), mats[0].shape
        self.proj: _Proj | None = None
        self._orders: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if _grouped(mats):
            # the rows as `matmul` reads them: packed or the file's (a packed Q5_0 differs in
            # its last bits from the plain rows)
            p = _Proj()
            p.nparts, p.n_out = 1, self.n_out
            self._ws = (ctypes.c_void_p * self.n_heads)(*(m.data.data_ptr() for m in mats))
            p.ws = self._ws
            p.types[0], p.ns[0] = mats[0].kernel_type, self.n_out
            p.row_bytes[0], p.cols[0] = mats[0].data.stride(0), 0
            self.proj = p

    def __call__(self, x: torch.Tensor, lora: LoraDelta | None) -> torch.Tensor:
        """x [T, H, >= in] float32 (rows of stride ``x.stride(1)``) -> [T, H, out], with the
        step's adapter deltas ``lora`` (None: none)."""
        t, h = x.shape[0], self.n_heads
        if self.proj is None or lora is not None or t == 0:
            return head_loop(self.mats, x[:, :, : self.n_in], lora)
        if x.stride(2) != 1 or x.stride(0) != h * x.stride(1):
            x = x[:, :, : self.n_in].contiguous()
        ld = x.stride(1)
        off, src = self._order(t)
        y = torch.empty(h * t, self.n_out)  # [H T, out] head-major
        rc = _kernels().ls_moe_matmul(
            ctypes.byref(self.proj), h, off.data_ptr(), self.n_in, x.data_ptr(), ld, t * h,
            src.data_ptr(), None, y.data_ptr(), torch.get_num_threads())  # fmt: skip
        _check(rc, "per-head matmul")
        return y.view(h, t, self.n_out).transpose(0, 1)  # [T, H, out] (a view)

    def _order(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head-major order of T tokens' pairs: each head's first row off [H + 1] and
        the source row t H + j of sorted row j T + t, src [H T]; kept for small T (decode)."""
        got = self._orders.get(t)
        if got is None:
            h = self.n_heads
            off = torch.arange(0, (h + 1) * t, t, dtype=torch.int64)  # [H + 1]
            src = (torch.arange(t) * h + torch.arange(h)[:, None]).reshape(-1)  # [H T]
            got = (off, src)
            if t <= 8:
                self._orders[t] = got
        return got


def head_loop(mats: list[Matrix], x: torch.Tensor, lora: LoraDelta | None) -> torch.Tensor:
    """x [T, H, in] -> [T, H, out]: head j's matrix on x[:, j], plus its adapter delta (a
    stacked target's head j, as an expert's)."""
    t, h = x.shape[0], len(mats)
    y = torch.empty(t, h, mats[0].shape[0])  # [T, H, out]
    rows = torch.arange(t)
    for j in range(h):
        xj = x[:, j].contiguous()  # [T, in]
        yj = matmul(xj, mats[j])  # [T, out]
        if lora is not None:
            yj = lora.apply_expert(mats[j].name, j, xj, yj, rows)
        y[:, j] = yj
    return y


def _grouped(mats: list[Matrix]) -> bool:
    """Whether the stack can run grouped: quantized rows (the file's or packed), one type,
    layout and size, C kernels built."""
    from loraserve.kernels.moe import GroupedExperts

    first = mats[0]
    same = all(m.kernel_type == first.kernel_type and m.shape == first.shape for m in mats)
    rows = all(m.data.dim() == 2 and m.data.stride(1) == 1 for m in mats)
    return same and rows and first.quantized and GroupedExperts.supports([first.kernel_type])
