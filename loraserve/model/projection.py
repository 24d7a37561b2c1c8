"""Projections on weights as the file stores them, plus each target's LoRA delta.

A `Matrix` is one weight as stored: ggml rows (uint8, any quantized type) or a float tensor
(F32/F16/BF16). A `Projection` holds one or more matrices side by side on its output
columns (q|k|v and gate|up run as one projection of one input) and picks each part's kernel
once, at construction, from its type: `kernels.qmatmul` for quantized rows (activations
quantized once per call, shared by every quantized part), `kernels.floatmm.fmatmul` for float rows.
Both kernels compute every output row from its own input row in a fixed order, so a
projection's result for a token never depends on the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
from torch import nn

from loraserve.kernels import (
    FLOAT_TYPES,
    PACKED,
    QUANT_TYPES,
    QuantizedParts,
    activation_block,
    pack_rows,
    qmatmul,
    quantize_rows,
    unpack_rows,
)
from loraserve.kernels.floatmm import fmatmul
from loraserve.model.context import get_context
from loraserve.model.dequant import GGML_QUANT_SIZES, dequantize, type_name

_TORCH_FLOAT = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


@dataclass(frozen=True)
class Matrix:
    """A 2-D weight [n_out, n_in] in its stored form.

    ``data`` is [n_out, row_bytes] uint8 ggml rows for quantized types, or [n_out, n_in] of
    float32/float16/bfloat16 for the float types (ids 0, 1, 30). ``packed``: the quantized
    rows repacked 8 to a group for the kernels (`kernels.pack_rows`), ``data`` then
    [n_out, group_bytes / 8] uint8 and ``row_bytes`` the file's bytes per row.
    """

    name: str
    data: torch.Tensor
    ggml_type: int
    shape: tuple[int, int]
    packed: bool = False
    row_bytes: int = 0

    @staticmethod
    def from_raw(name: str, raw: torch.Tensor, ggml_type: int, shape: tuple[int, int]) -> Matrix:
        """ggml bytes of a [n_out, n_in] tensor -> Matrix (float types viewed as floats)."""
        if ggml_type not in QUANT_TYPES and ggml_type not in FLOAT_TYPES:
            raise ValueError(
                f"tensor {name!r} has ggml type {type_name(ggml_type)}, which loraserve has no "
                f"kernel for; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, "
                f"Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0, IQ2_XXS, "
                f"IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M"
            )
        rows = raw.reshape(shape[0], -1)  # [n_out, row_bytes]
        if ggml_type in FLOAT_TYPES:
            rows = rows.view(_TORCH_FLOAT[ggml_type])  # [n_out, n_in]
        return Matrix(name, rows, ggml_type, shape)

    @staticmethod
    def from_float(name: str, w: torch.Tensor) -> Matrix:
        """A float tensor [n_out, n_in] (float32, float16 or bfloat16) as a Matrix."""
        t = {v: k for k, v in _TORCH_FLOAT.items()}.get(w.dtype)
        if t is None:
            w, t = w.float(), 0
        return Matrix(name, w.contiguous(), t, (w.shape[0], w.shape[1]))

    @property
    def quantized(self) -> bool:
        return self.ggml_type in QUANT_TYPES

    @property
    def kernel_type(self) -> int:
        """The type code the kernels read ``data`` as (`kernels.PACKED` set when packed)."""
        return self.ggml_type | PACKED if self.packed else self.ggml_type

    def file_rows(self) -> torch.Tensor:
        """The weight as ggml rows [n_out, row_bytes] (unpacked when packed)."""
        if not self.packed:
            return self.data
        return unpack_rows(self.data, self.ggml_type, self.shape[1], self.row_bytes)

    def pack(self) -> Matrix:
        """This matrix with its rows repacked for the kernels where its type has a packed
        kernel (the same values: `kernels.pack_rows`), else itself."""
        if self.packed or not self.quantized:
            return self
        data = pack_rows(self.data, self.ggml_type, self.shape[1])
        if data is None:
            return self
        return Matrix(self.name, data, self.ggml_type, self.shape, True, self.data.shape[1])

    def rows(self, index: torch.Tensor) -> Matrix:
        """The rows ``index`` [r] (a reordering or a subset), copied, as ggml rows."""
        return Matrix(self.name, self.file_rows().index_select(0, index), self.ggml_type,
                      (index.numel(), self.shape[1]))  # fmt: skip

    def dequantized(self) -> torch.Tensor:
        """float32 [n_out, n_in] copy of the weight's values."""
        if not self.quantized:
            return self.data.float()
        return dequantize(self.file_rows().contiguous(), self.ggml_type, self.shape,
                          name=self.name)  # fmt: skip

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


def matmul(x: torch.Tensor, m: Matrix, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, n_in] float32 -> [T, n_out] through ``m``'s kernel (for one-off projections
    such as experts; `Projection` shares the activation quantization between parts)."""
    if m.quantized:
        xa = quantize_rows(x, activation_block(m.ggml_type))
        return qmatmul(xa, m.data, m.kernel_type, out)
    return fmatmul(x, m.data, out)


class Projection(nn.Module):
    """``y = x W^T + b`` with W the parts side by side, plus the step's LoRA delta.

    ``name`` is the projection's GGUF name (``blk.3.attn_qkv.weight`` for a fused one);
    each part keeps its own tensor name, which is how adapters address their targets, and
    its delta is added on that part's output columns.
    """

    def __init__(self, name: str, parts: list[Matrix], bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if not parts:
            raise ValueError(f"{name}: a projection needs at least one weight")
        n_in = {p.shape[1] for p in parts}
        if len(n_in) != 1:
            raise ValueError(f"{name}: parts disagree on the input size {sorted(n_in)}")
        self.name = name
        self.parts = parts
        self.in_features = parts[0].shape[1]
        ends = list(accumulate(p.shape[0] for p in parts))
        self.out_features = ends[-1]
        # (LoRA target, first column, end column) per part
        self.spans = [(p.name, e - p.shape[0], e) for p, e in zip(parts, ends, strict=True)]
        self.bias = None if bias is None else bias.float()  # [out]
        self._quantized = any(p.quantized for p in parts)
        for p in parts:
            if p.quantized and self.in_features % GGML_QUANT_SIZES[p.ggml_type][0]:
                raise ValueError(f"{p.name}: {self.in_features} inputs is not whole blocks")
        # the quantized parts run as one kernel call; float parts one call each
        quant = [
            (p.data, p.kernel_type, lo)
            for p, (_, lo, _) in zip(parts, self.spans, strict=True)
            if p.quantized
        ]
        self._qparts = QuantizedParts(quant) if quant else None

    def base(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] float32 -> [T, out] float32 without LoRA."""
        y = torch.empty(x.shape[0], self.out_features)  # [T, out]
        if self._qparts is not None:
            self._qparts(x, y)
        for p, (_, lo, hi) in zip(self.parts, self.spans, strict=True):
            if not p.quantized:
                fmatmul(x, p.data, y if len(self.parts) == 1 else y[:, lo:hi])
        if self.bias is not None:
            y += self.bias
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # [T, out]
        lora = get_context().lora
        if lora is None:
            return y
        if len(self.spans) == 1:
            return lora.apply(self.spans[0][0], x, y)
        for target, lo, hi in self.spans:
            part = y[:, lo:hi]
            out = lora.apply(target, x, part)
            if out is not part:  # deltas may come back as a new tensor
                part.copy_(out)
        return y
