"""Decoder building blocks: projections (float or int8; fused q|k|v, gate|up), norms, rope."""

from __future__ import annotations

from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import nn

from loraserve.model.context import get_context
from loraserve.model.int8mm import Int8Matmul, int8_matmul


class Linear(nn.Module):
    """``y = x W^T + b`` plus the step's LoRA delta for this tensor.

    ``name`` is the GGUF base tensor name (``blk.3.attn_q.weight``), which is how
    adapters address their targets. With ``int8`` the weight is also kept as int8 with
    one scale per output row, used for generated tokens (decode): torch's CPU
    ``_weight_int8pack_mm`` is ~2x faster than a float32 matmul for a few rows, but only
    with bf16 activations, and slower than float32 from ~32 rows on (measured on
    Gemma-270M shapes), so prompt rows keep the exact float weights.
    """

    def __init__(
        self,
        name: str,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        int8: bool = False,
        keep_float: bool = True,
        prepared: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.w8: torch.Tensor | None = None  # [out, in] int8
        self.s8: torch.Tensor | None = None  # [out] bf16
        self.mm: Int8Matmul | None = None  # int8 x int8 kernel over w8, where enabled
        in_features = (weight if weight is not None else prepared[0]).shape[1]  # type: ignore[index]
        # torch's int8 kernel needs in % 16 == 0 (it crashes otherwise); GGUF rows are
        # whole 32-value blocks, so only odd HF shapes stay on float weights
        int8 = int8 and in_features % 16 == 0
        if int8:
            self.w8, self.s8 = prepared if prepared is not None else quantize_int8(weight)
        self.out_features, self.in_features = (weight if weight is not None else self.w8).shape
        self.weight = weight.to(dtype).contiguous() if (keep_float or self.w8 is None) else None
        self.bias = None if bias is None else bias.to(dtype)
        # LoRA targets and their output columns: one for a plain projection
        self.spans = [(name, 0, self.out_features)]

    def base(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] -> [T, out] without LoRA.

        Which weights a row uses depends only on the row, never on the batch: prompt
        rows use the float weights, generated-token rows the int8 ones (`StepContext.
        int8_rows`). So a prompt computes the same KV whether it is prefilled in one
        chunk, in several, or resumed from the prefix cache, and cache-on answers equal
        cache-off answers.
        """
        if self.weight is None:  # int8 only (the output projection)
            y = self._int8(x)
        elif self.w8 is None:
            y = F.linear(x, self.weight)
        else:
            rows = get_context().int8_rows
            if rows is None:
                y = F.linear(x, self.weight)
            elif rows.shape[0] == x.shape[0]:
                y = self._int8(x)
            else:
                y = F.linear(x, self.weight)
                y[rows] = self._int8(x[rows])
        if self.bias is not None:
            y = y + self.bias
        return y

    def use_int8_matmul(self) -> bool:
        """Run the int8 rows through oneDNN's int8 x int8 kernel (`int8mm`) instead of
        the weight-only one; False where that kernel is unavailable on this CPU."""
        if self.w8 is not None and self.s8 is not None and self.mm is None:
            self.mm = int8_matmul(self.w8, self.s8)
        return self.mm is not None

    def drop_int8_source(self) -> None:
        """Free ``w8`` once the int8 kernel holds its own packed copy and no float weights
        are kept (168 MB for Gemma's output); call after the prepared cache is written."""
        if self.mm is not None and self.weight is None:
            self.w8 = None

    def _int8(self, x: torch.Tensor) -> torch.Tensor:
        if self.mm is not None:
            return self.mm(x).to(x.dtype)
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.w8, self.s8)
        return y.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # [T, out]
        lora = get_context().lora
        if lora is None:
            return y
        if len(self.spans) == 1:
            return lora.apply(self.name, x, y)
        for target, lo, hi in self.spans:
            part = y[:, lo:hi]
            out = lora.apply(target, x, part)
            if out is not part:  # deltas may come back as a new tensor
                part.copy_(out)
        return y


class FusedLinear(Linear):
    """Projections of one input as one matmul (q|k|v, gate|up): a decode step is mostly
    per-call overhead at one or a few rows, and one call reads the same bytes as three.

    ``parts`` are the GGUF names and output sizes of the pieces, in column order; each
    keeps its own LoRA target, added onto its columns of the fused output.
    """

    def __init__(
        self,
        name: str,
        parts: list[tuple[str, int]],
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        int8: bool = False,
        prepared: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        super().__init__(name, weight, bias, dtype, int8, prepared=prepared)
        ends = list(accumulate(n for _, n in parts))
        if ends[-1] != self.out_features:
            raise ValueError(f"{name}: parts cover {ends[-1]} of {self.out_features} outputs")
        self.spans = [(t, end - n, end) for (t, n), end in zip(parts, ends, strict=True)]


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: weight [out, in] -> (int8 [out, in], bf16 scales [out])."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale.to(torch.bfloat16)


class RowEmbedding(nn.Module):
    """Embedding lookup straight from a GGUF tensor's raw (possibly quantized) rows.

    ggml stores each row as whole blocks, so dequantizing only the looked-up rows gives
    exactly the values of the full table, without a 671 MB float32 copy for Gemma's
    262,144 x 640 vocabulary.
    """

    def __init__(self, raw: torch.Tensor, ggml_type: int, dim: int) -> None:
        super().__init__()
        self.raw = raw  # [V, row_bytes] uint8
        self.ggml_type, self.dim = ggml_type, dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from loraserve.model.dequant import dequantize

        rows = self.raw.index_select(0, ids)  # [T, row_bytes]
        return dequantize(rows, self.ggml_type, (ids.shape[0], self.dim))  # [T, dim] float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 (as transformers and llama.cpp do); weight used as is."""
    f32 = x.dtype == torch.float32  # no .float()/.to() calls then: ~2 us each, 180 a step
    xf = x if f32 else x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True).add_(eps))).mul_(weight)
    return y if f32 else y.to(x.dtype)


class Rope(nn.Module):
    """Rotary embedding, NeoX layout (rotate halves), as HF-layout weights expect."""

    def __init__(self, head_dim: int, theta: float, max_pos: int) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
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
        """cos, sin for ``positions`` [T] -> ([T, 1, D/2], [T, 1, D/2]), once per step."""
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves of x [T, H, D] by the step's tables (float32 maths, x's dtype out)."""
    half = x.shape[-1] // 2
    f32 = x.dtype == torch.float32
    xf = x if f32 else x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    y = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return y if f32 else y.to(x.dtype)


def gated_act(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up for 'silu' (llama, qwen) and 'gelu_tanh' (gemma)."""
    if act == "silu":
        return F.silu(gate) * up
    return F.gelu(gate, approximate="tanh") * up
