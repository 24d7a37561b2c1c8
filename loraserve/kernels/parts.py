"""Quantized matrices of one input side by side on the output columns, in one kernel call."""

from __future__ import annotations

import ctypes

import torch

from loraserve import kernels as K


class QuantizedParts:
    """Quantized matrices of one input side by side on the output columns (q|k|v, gate|up),
    multiplied in one kernel call (one thread fork per projection, not one per part).

    ``parts``: (rows [N_i, row_bytes] uint8, ggml type, first output column) each.
    """

    def __init__(self, parts: list[tuple[torch.Tensor, int, int]]) -> None:
        if not 1 <= len(parts) <= 8:
            raise ValueError(f"QuantizedParts takes 1 to 8 parts, got {len(parts)}")
        for raw, t, _ in parts:
            if (t & ~K.PACKED) not in K.QUANT_TYPES or (t & K.PACKED and K._c() is None):
                raise ValueError(f"no quantized kernel for ggml type {t}")
            if raw.stride(1) != 1:
                raise ValueError("weight rows must be contiguous")
        self.parts = parts
        n = len(parts)
        self._n = n
        self._types = (ctypes.c_int * n)(*[t for _, t, _ in parts])
        self._ws = (ctypes.c_void_p * n)(*[raw.data_ptr() for raw, _, _ in parts])
        self._ns = (ctypes.c_int64 * n)(*[raw.shape[0] for raw, _, _ in parts])
        self._rb = (ctypes.c_int64 * n)(*[raw.stride(0) for raw, _, _ in parts])
        self._cols = (ctypes.c_int64 * n)(*[c for _, _, c in parts])

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """x [M, K] float32 (quantized inside the call) -> each part's columns of out [M, *]
        float32 (unit column stride)."""
        m, k = x.shape
        lib = K._c()
        if lib is None or m == 0:
            blocks = {K.activation_block(t) for _, t, _ in self.parts}
            xas = {b: K.quantize_rows(x, b) for b in blocks}
            for raw, t, c in self.parts:
                K.qmatmul(xas[K.activation_block(t)], raw, t, out[:, c : c + raw.shape[0]])
            return out
        if out.stride(1) != 1:
            raise ValueError("QuantizedParts needs a unit column stride for out")
        if x.dtype != torch.float32 or k % 32:
            raise ValueError(
                f"QuantizedParts needs float32 [M, K*32], got {x.dtype} {tuple(x.shape)}"
            )
        if x.stride(1) != 1:
            x = x.contiguous()
        if out.shape[0] != m:
            raise ValueError(f"QuantizedParts: out has {out.shape[0]} rows for {m}")
        rc = lib.ls_qmatmul_multi_f32(self._n, self._types, self._ws, self._ns, self._rb,
                                      self._cols, k, x.data_ptr(), K._ld(x), m,
                                      out.data_ptr(), K._ld(out),
                                      torch.get_num_threads())  # fmt: skip
        if rc == -3:
            raise ValueError(K._SIZES.format(k=k, t=list(self._types), rb=list(self._rb)))
        if rc != 0:
            raise ValueError(f"quantized matmul failed ({rc}): a refused type or no memory")
        return out
