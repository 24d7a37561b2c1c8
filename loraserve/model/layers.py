"""Decoder building blocks: embedding rows, norms, rope, gated activations."""

from __future__ import annotations

import torch
from torch import nn

from loraserve.kernels.rowops import gated_act as _gated_act
from loraserve.kernels.rowops import norm_rope as _norm_rope
from loraserve.kernels.rowops import rms_norm as _rms_norm


class RowEmbedding(nn.Module):
    """Embedding lookup straight from a GGUF tensor's raw (possibly quantized) rows.

    ggml stores each row as whole blocks, so dequantizing only the looked-up rows gives
    exactly the values of the full table, without a 671 MB float32 copy for Gemma's
    262,144 x 640 vocabulary.

    With a tied output matrix packed at load (`read_packed`), the rows are unpacked from
    that copy instead: the file's pages of the table are then never mapped in again, where
    each looked-up row faulted in 64 KiB of them (the kernel's fault-around), so random
    prompts kept a second copy of the vocabulary resident beside the packed one.
    """

    def __init__(self, raw: torch.Tensor, ggml_type: int, dim: int) -> None:
        super().__init__()
        self.raw = raw  # [V, row_bytes] uint8
        self.ggml_type, self.dim = ggml_type, dim
        self.packed: torch.Tensor | None = None  # [V, group_bytes / 8] (`read_packed`)

    def read_packed(self, packed: torch.Tensor) -> None:
        """Look rows up in `packed`: the same rows of the same type packed 8 to a group
        (`kernels.pack_rows`), so the unpacked bytes are the file's."""
        if packed.shape[0] != self.raw.shape[0] or packed.shape[0] % 8:
            raise ValueError(f"packed rows {tuple(packed.shape)} for a table of {self.raw.shape}")
        self.packed = packed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from loraserve.kernels.embed_rows import dequant_packed_rows, dequant_rows
        from loraserve.model.dequant import dequantize

        if self.packed is not None:
            rb = self.raw.shape[1]  # one C call, the same values:
            out = dequant_packed_rows(self.packed, ids, self.ggml_type, self.dim, rb)
            if out is not None:
                return out  # [T, dim] float32
            from loraserve.kernels.pack import unpack_rows

            groups, at = torch.unique(ids // 8, return_inverse=True)
            width = self.packed.shape[1]
            sub = self.packed.view(-1, 8 * width).index_select(0, groups).view(-1, width)
            rb = self.raw.shape[1]
            unpacked = unpack_rows(sub, self.ggml_type, self.dim, rb).view(-1, 8, rb)
            rows = unpacked[at, ids % 8]  # [T, row_bytes]
        else:
            rows = self.raw.index_select(0, ids)  # [T, row_bytes]
        out = dequant_rows(rows, self.ggml_type, self.dim)  # one C call, the same values
        if out is not None:
            return out
        return dequantize(rows, self.ggml_type, (ids.shape[0], self.dim))  # [T, dim] float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 (as transformers and llama.cpp do); weight used as is
    ([K], or [H, K] per head for x [T, H, K]). One C call (`kernels.rowops`)."""
    return _rms_norm(x, weight, eps)


class Rope(nn.Module):
    """Rotary embedding, NeoX layout (rotate halves), as HF-layout weights expect.

    ``factors`` [D/2] (phi3's rope_factors_short/long): frequency i divided by factors[i],
    as llama.cpp's rope freq factors."""

    def __init__(
        self, head_dim: int, theta: float, max_pos: int, factors: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        if factors is not None:
            inv = inv / factors.float().reshape(-1)
        self.inv_freq = inv  # [D/2]
        self.head_dim = head_dim
        self._cos = torch.empty(0)
        self._sin = torch.empty(0)
        self._grow(max_pos)

    def ensure(self, max_pos: int) -> None:
        """Make the tables cover positions 0..max_pos (called once per step)."""
        if max_pos >= self._cos.shape[0]:
            self._grow(max(max_pos + 1, 2 * self._cos.shape[0]))

    def _grow(self, n: int) -> None:
        t = torch.arange(n, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)  # [n, D/2]
        self._cos, self._sin = freqs.cos(), freqs.sin()

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for ``positions`` [T] -> ([T, D/2], [T, D/2]), once per step."""
        return self._cos[positions], self._sin[positions]


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Rotate halves of x [T, H, D] float32 by the step's tables cos/sin [T, D/2], after a
    per-head RMSNorm by ``norm`` [H, D] when given; one C call (`kernels.rowops`)."""
    return _norm_rope(x, norm, eps, cos, sin)


def gated_act(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up for 'silu' (llama, qwen) and 'gelu_tanh' (gemma); one C call
    (`kernels.rowops`)."""
    return _gated_act(gate, up, act)
