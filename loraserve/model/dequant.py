"""ggml tensor types and their dequantization to float32, vectorized in torch.

Every routine is bit-identical to gguf-py's numpy reference (`gguf.quants.dequantize`): the
same products and differences are formed in float32 in the same order, and nothing is fused.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import torch

from loraserve.model import dequant_iq, dequant_nl

# name -> ggml type id (ggml.h); ids 4, 5 and 31-33 are retired
GGML_TYPE: dict[str, int] = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15,
    "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21,
    "IQ2_S": 22, "IQ4_XS": 23, "I8": 24, "I16": 25, "I32": 26, "I64": 27, "F64": 28,
    "IQ1_M": 29, "BF16": 30, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39, "NVFP4": 40, "Q1_0": 41,
}  # fmt: skip
GGML_TYPE_NAME: dict[int, str] = {v: k for k, v in GGML_TYPE.items()}

# type id -> (elements per block, bytes per block)
GGML_QUANT_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4),
    27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66),
    39: (32, 17), 40: (64, 36), 41: (128, 18),
}  # fmt: skip
GGML_BLOCK_SIZE: dict[int, int] = {t: b for t, (b, _) in GGML_QUANT_SIZES.items()}
GGML_TYPE_SIZE: dict[int, int] = {t: s for t, (_, s) in GGML_QUANT_SIZES.items()}

QK_K = 256
_CHUNK_ELEMENTS = 1 << 18  # per step, so the temporaries of one step stay in cache


class UnsupportedQuantError(ValueError):
    """A tensor's ggml type has no dequantizer here."""


def type_name(ggml_type: int) -> str:
    """The ggml name of a type id, or `type<id>` for an id ggml does not define."""
    return GGML_TYPE_NAME.get(ggml_type, f"type{ggml_type}")


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes taken by a tensor of `shape` (torch order) stored as `ggml_type`.

    Raises ValueError if the type is unknown or the row length is not a whole number of blocks.
    """
    if ggml_type not in GGML_QUANT_SIZES:
        raise ValueError(f"unknown ggml type id {ggml_type}")
    block, size = GGML_QUANT_SIZES[ggml_type]
    row = shape[-1] if shape else 1
    if row % block:
        raise ValueError(
            f"row length {row} is not a multiple of the {type_name(ggml_type)} block size {block}"
        )
    return math.prod(shape) // block * size


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 holding a little-endian half -> (n, 1) float32."""
    return _half(b.contiguous())


def _half(h: torch.Tensor) -> torch.Tensor:
    """uint8 bytes of little-endian halves -> float32, one per half.

    The CPU quiets signalling NaNs when it widens them; numpy (the reference) keeps them
    signalling, so their quiet bit is cleared again.
    """
    h = h.view(torch.int16)
    out = h.view(torch.float16).to(torch.float32)
    if out.isnan().any():
        bits = h.to(torch.int32)
        snan = ((bits & 0x7C00) == 0x7C00) & ((bits & 0x03FF) != 0) & ((bits & 0x0200) == 0)
        out.view(torch.int32)[snan] &= ~0x00400000
    return out


_BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)
_CRUMB_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)  # four 2-bit fields per byte
_NIBBLE_SHIFTS = torch.tensor([0, 4], dtype=torch.uint8)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(n, k) uint8 -> (n, 2k): the k low nibbles, then the k high nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """(n, 4) uint8 holding a little-endian uint32 -> (n, 32) of its bits, bit 0 first."""
    return ((qh.unsqueeze(-1) >> _BIT_SHIFTS) & 1).reshape(qh.shape[0], 32)


def _float(q: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
    """Small integers -> exact float32, minus `offset`."""
    q = q.to(torch.float32)
    return q.sub_(offset) if offset else q


# Each decoder reads (n, type_size) uint8 blocks and writes (n, block_size) float32 into out,
# forming exactly the reference's float32 products and sums.


def _q4_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: d f16 | 16 bytes of nibbles
    torch.mul(_f16(b[:, :2]), _float(_nibbles(b[:, 2:]), 8.0), out=out)


def _q4_1(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: d f16 | m f16 | 16 bytes of nibbles
    torch.mul(_f16(b[:, :2]), _float(_nibbles(b[:, 4:])), out=out).add_(_f16(b[:, 2:4]))


def _q5_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: d f16 | qh u32 (5th bits) | 16 bytes of nibbles
    q = _nibbles(b[:, 6:]).bitwise_or_(_bits32(b[:, 2:6]) << 4)
    torch.mul(_f16(b[:, :2]), _float(q, 16.0), out=out)


def _q5_1(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: d f16 | m f16 | qh u32 | 16 bytes of nibbles
    q = _nibbles(b[:, 8:]).bitwise_or_(_bits32(b[:, 4:8]) << 4)
    torch.mul(_f16(b[:, :2]), _float(q), out=out).add_(_f16(b[:, 2:4]))


def _q8_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: d f16 | 32 int8
    torch.mul(_float(b[:, 2:].view(torch.int8)), _f16(b[:, :2]), out=out)


def _q2_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: 16 scale bytes (low nibble scale, high nibble min) | 64 bytes of 2-bit q | d | dmin
    n = b.shape[0]
    scales = b[:, :16]
    dl = (_f16(b[:, 80:82]) * _float(scales & 0x0F)).unsqueeze(-1)  # (n, 16, 1)
    ml = (_f16(b[:, 82:84]) * _float(scales >> 4)).unsqueeze(-1)
    q = (b[:, 16:80].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    torch.mul(dl, _float(q.reshape(n, 16, 16)), out=out.view(n, 16, 16)).sub_(ml)


def _q3_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: hmask 32 | qs 64 (2-bit) | 12 bytes of 6-bit scales | d
    n = b.shape[0]
    lo = (b[:, 96:104].reshape(n, 1, 8) >> _NIBBLE_SHIFTS.reshape(1, 2, 1)).reshape(n, 16)
    hi = (b[:, 104:108].reshape(n, 1, 4) >> _CRUMB_SHIFTS.reshape(1, 4, 1)).reshape(n, 16)
    scales = _float((lo & 0x0F) | ((hi & 3) << 4), 32.0)
    dl = (_f16(b[:, 108:110]) * scales).unsqueeze(-1)  # (n, 16, 1)
    ql = (b[:, 32:96].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    qh = (b[:, :32].reshape(n, 1, 1, 32) >> _BIT_SHIFTS.reshape(1, 1, 8, 1)) & 1
    # a set hmask bit means no offset, a clear one subtracts 4
    q = _float(ql.reshape(n, 16, 16)).sub_(_float((qh ^ 1) << 2).reshape(n, 16, 16))
    torch.mul(dl, q, out=out.view(n, 16, 16))


def _k_affine(b: torch.Tensor, q: torch.Tensor, out: torch.Tensor) -> None:
    """Q4_K / Q5_K: out = d*scale*q - dmin*min, with q (n, 8, 32) small integers."""
    s = b[:, 4:16]  # 8 6-bit scales and 8 6-bit mins, packed
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)  # (n, 8)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    dl = (_f16(b[:, :2]) * _float(sc)).unsqueeze(-1)  # (n, 8, 1)
    ml = (_f16(b[:, 2:4]) * _float(mn)).unsqueeze(-1)
    torch.mul(dl, _float(q), out=out.view(-1, 8, 32)).sub_(ml)


def _q4_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: d | dmin | 12 scale bytes | 128 bytes of nibbles (4 groups of 32 bytes)
    qs = b[:, 16:].reshape(-1, 4, 1, 32)
    _k_affine(b, torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 8, 32), out)


def _q5_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: d | dmin | 12 scale bytes | qh 32 | 128 bytes of nibbles
    qs = b[:, 48:].reshape(-1, 4, 1, 32)
    ql = torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 8, 32)
    qh = (b[:, 16:48].reshape(-1, 1, 32) >> _BIT_SHIFTS.reshape(1, 8, 1)) & 1
    _k_affine(b, ql.bitwise_or_(qh << 4), out)


def _q6_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block: ql 128 | qh 64 | 16 int8 scales | d
    n = b.shape[0]
    ql = b[:, :128].reshape(n, 2, 1, 64)
    ql = torch.cat([ql & 0x0F, ql >> 4], dim=2).reshape(n, 8, 32)
    qh = (b[:, 128:192].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    q = _float(ql.bitwise_or_(qh.reshape(n, 8, 32) << 4), 32.0)
    d = (_f16(b[:, 208:210]) * _float(b[:, 192:208].view(torch.int8))).unsqueeze(-1)
    torch.mul(d, q.reshape(n, 16, 16), out=out.view(n, 16, 16))  # d: (n, 16, 1)


_BLOCK_FNS: dict[int, Callable[[torch.Tensor, torch.Tensor], None]] = {
    2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0,
    10: _q2_k, 11: _q3_k, 12: _q4_k, 13: _q5_k, 14: _q6_k, **dequant_nl.BLOCK_FNS,
    **dequant_iq.BLOCK_FNS,
}  # fmt: skip
SUPPORTED_TYPES: frozenset[int] = frozenset({0, 1, 30, *_BLOCK_FNS})


def _as_u8(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A flat uint8 torch view of `raw`, sharing its memory (never written)."""
    if isinstance(raw, np.ndarray):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writ")
            raw = torch.from_numpy(np.ascontiguousarray(raw).reshape(-1))
    if raw.dtype != torch.uint8:
        raise TypeError(f"raw tensor data must be uint8, got {raw.dtype}")
    return raw.reshape(-1)


def dequantize(
    raw: np.ndarray | torch.Tensor,
    ggml_type: int,
    shape: tuple[int, ...],
    name: str | None = None,
) -> torch.Tensor:
    """Decode a tensor's raw bytes to a new float32 tensor of `shape`.

    `raw` holds exactly the tensor's bytes (uint8, any shape, contiguous); `shape` is in torch
    order. `name` only labels error messages. Raises UnsupportedQuantError for a type without
    a decoder and ValueError when the byte count does not match the shape.
    """
    label = f"tensor {name!r}" if name else "tensor"
    if ggml_type not in SUPPORTED_TYPES:
        supported = ", ".join(type_name(t) for t in sorted(SUPPORTED_TYPES))
        raise UnsupportedQuantError(
            f"{label} has ggml type {type_name(ggml_type)} ({ggml_type}), which loraserve "
            f"cannot dequantize; supported: {supported}"
        )
    try:
        expected = tensor_nbytes(ggml_type, tuple(shape))
    except ValueError as e:
        raise ValueError(f"{label} of shape {tuple(shape)}: {e}") from None
    b = _as_u8(raw)
    if b.numel() != expected:
        raise ValueError(
            f"{label} of shape {tuple(shape)} and type {type_name(ggml_type)} needs "
            f"{expected} bytes, got {b.numel()}"
        )
    if ggml_type == 0:
        return b.clone().view(torch.float32).reshape(shape)
    if ggml_type == 1:
        return _half(b).reshape(shape)
    if ggml_type == 30:
        return (
            (b.clone().view(torch.int16).to(torch.int32) << 16).view(torch.float32).reshape(shape)
        )
    block, size = GGML_QUANT_SIZES[ggml_type]
    blocks = b.reshape(-1, size)  # (n_blocks, type_size)
    fn = _BLOCK_FNS[ggml_type]
    out = torch.empty(blocks.shape[0], block, dtype=torch.float32)  # (n_blocks, block)
    step = max(1, _CHUNK_ELEMENTS // block)
    for start in range(0, blocks.shape[0], step):
        fn(blocks[start : start + step], out[start : start + step])
    return out.reshape(shape)
