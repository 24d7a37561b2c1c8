"""Building blocks of the decoder: projections (float or int8 weight-only), norms, rope."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loraserve.model.context import get_context


class Linear(nn.Module):
    """``y = x W^T + b`` plus the step's LoRA delta for this tensor.

    ``name`` is the GGUF base tensor name (``blk.3.attn_q.weight``), which is how
    adapters address their targets. With ``int8`` the weight is also kept as int8 with
    one scale per output row, used for small batches (decode): torch's CPU
    ``_weight_int8pack_mm`` is ~2x faster than a float32 matmul there, but only with
    bf16 activations, and it is slower than float32 from ~32 rows on (measured on
    Gemma-270M shapes), so prefill keeps the exact float weights.
    """

    INT8_MAX_ROWS = 16

    def __init__(
        self,
        name: str,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        int8: bool = False,
        keep_float: bool = True,
    ) -> None:
        super().__init__()
        self.name = name
        self.out_features, self.in_features = weight.shape
        self.w8: torch.Tensor | None = None
        self.s8: torch.Tensor | None = None
        if int8:
            w = weight.float()
            scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
            self.w8 = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)  # [out, in]
            self.s8 = scale.to(torch.bfloat16)
        self.weight = weight.to(dtype).contiguous() if (keep_float or not int8) else None
        self.bias = None if bias is None else bias.to(dtype)

    def base(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] -> [T, out] without LoRA."""
        if self.w8 is not None and (self.weight is None or x.shape[0] <= self.INT8_MAX_ROWS):
            y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.w8, self.s8)
            y = y.to(x.dtype)
        else:
            y = F.linear(x, self.weight)
        if self.bias is not None:
            y = y + self.bias
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        lora = get_context().lora
        if lora is not None:
            y = lora.apply(self.name, x, y)
        return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 (as transformers and llama.cpp do); weight used as is."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight).to(x.dtype)


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

    def _grow(self, n: int) -> None:
        t = torch.arange(n, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)  # [n, D/2]
        self._cos, self._sin = freqs.cos(), freqs.sin()

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, H, D], positions: [T] -> rotated x (same dtype)."""
        if int(positions.max()) >= self._cos.shape[0]:
            self._grow(max(int(positions.max()) + 1, 2 * self._cos.shape[0]))
        cos = self._cos[positions].unsqueeze(1)  # [T, 1, D/2]
        sin = self._sin[positions].unsqueeze(1)
        xf = x.float()
        x1, x2 = xf[..., : self.head_dim // 2], xf[..., self.head_dim // 2 :]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return out.to(x.dtype)


def gated_act(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up for 'silu' (llama, qwen) and 'gelu_tanh' (gemma)."""
    if act == "silu":
        return F.silu(gate) * up
    return F.gelu(gate, approximate="tanh") * up
