"""Dequantization of the grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) in
torch, bit-identical to gguf-py's numpy reference (`gguf.quants`): the same float32 products
in the same order. The grids and the sign table are read from the C kernels' headers
(`kernels/iq_grids.h`, `kernels/iq1_grid.h`, ggml-common.h's tables), so the kernels and
these decoders use one copy. Each decoder reads (n, type_size) uint8 blocks and writes
(n, 256) float32 into ``out``; `dequant.py` dispatches to them."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import torch

_KERNELS = Path(__file__).resolve().parents[1] / "kernels"
_DELTA = 0.125  # IQ1S_DELTA, IQ1M_DELTA


@functools.cache
def _table(name: str) -> torch.Tensor:
    """A table of the kernels' grid headers as int64 [entries]."""
    for header in ("iq_grids.h", "iq1_grid.h"):
        text = (_KERNELS / header).read_text()
        m = re.search(r"\b" + name + r"\[\d+\] = \{(.*?)\};", text, re.S)
        if m:
            vals = [int(v, 0) for v in m.group(1).replace(",", " ").split()]
            return torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in vals])
    raise KeyError(name)


@functools.cache
def _grid(name: str, width: int, signed: bool = False) -> torch.Tensor:
    """A grid table as float32 [entries, width]: each entry's bytes, lowest first."""
    t = _table(name).unsqueeze(-1)
    b = (t >> (8 * torch.arange(width))) & 0xFF  # [entries, width]
    if signed:
        b = torch.where(b >= 128, b - 256, b)
    return b.float()


@functools.cache
def _sign_bits() -> torch.Tensor:
    """ksigns_iq2xs as [128, 8] float32 signs (+1, -1), bit j first."""
    k = _table("KSIGNS_IQ2XS").unsqueeze(-1)
    return torch.where((k >> torch.arange(8)) & 1 == 0, 1.0, -1.0)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 little-endian halves -> (n, 1) float32."""
    return b.clone(memory_format=torch.contiguous_format).view(torch.float16).to(torch.float32)


def _u16(b: torch.Tensor) -> torch.Tensor:
    return b.clone(memory_format=torch.contiguous_format).view(torch.int16).long() & 0xFFFF


def _u32(b: torch.Tensor) -> torch.Tensor:
    return b.clone(memory_format=torch.contiguous_format).view(torch.int32).long() & 0xFFFFFFFF


def _bits8(b: torch.Tensor) -> torch.Tensor:
    """(..., k) uint8 -> (..., k, 8) float32 signs of each bit (+1 clear, -1 set), bit 0 first."""
    return torch.where((b.long().unsqueeze(-1) >> torch.arange(8)) & 1 == 0, 1.0, -1.0)


def iq2_xxs(b: torch.Tensor, out: torch.Tensor) -> None:
    # d f16 | per 32: 4 grid indices (bytes), then 4 x 7 sign bits and a 4-bit scale (u32)
    n = b.shape[0]
    q = _u32(b[:, 2:66]).reshape(n, 8, 2)
    db = _f16(b[:, :2]) * (0.5 + (q[..., 1] >> 28).float()) * 0.25  # (n, 8)
    sidx = (q[..., 1].unsqueeze(-1) >> torch.tensor([0, 7, 14, 21])) & 0x7F  # (n, 8, 4)
    signs = _sign_bits()[sidx]  # (n, 8, 4, 8)
    gidx = b[:, 2:66].reshape(n, 8, 8)[..., :4].long()  # (n, 8, 4)
    grid = _grid("IQ2XXS_GRID", 8)[gidx]  # (n, 8, 4, 8)
    torch.mul(db.reshape(n, 8, 1, 1) * grid, signs, out=out.view(n, 8, 4, 8))


def iq2_xs(b: torch.Tensor, out: torch.Tensor) -> None:
    # d f16 | qs u16[32]: 9-bit grid index, 7-bit sign index | scales[8]: a nibble per 16
    n = b.shape[0]
    qs = _u16(b[:, 2:66])  # (n, 32)
    sc = b[:, 66:74].long()
    sc = torch.stack([sc & 15, sc >> 4], dim=-1).reshape(n, 16)
    db = _f16(b[:, :2]) * (0.5 + sc.float()) * 0.25  # (n, 16)
    signs = _sign_bits()[qs >> 9].reshape(n, 16, 2, 8)
    grid = _grid("IQ2XS_GRID", 8)[qs & 511].reshape(n, 16, 2, 8)
    torch.mul(db.reshape(n, 16, 1, 1) * grid, signs, out=out.view(n, 16, 2, 8))


def iq2_s(b: torch.Tensor, out: torch.Tensor) -> None:
    # d f16 | qs[32] grid index low bits | signs[32] | qh[8]: 2 high bits each | scales[8]
    n = b.shape[0]
    sc = b[:, 74:82].long()
    sc = torch.stack([sc & 15, sc >> 4], dim=-1).reshape(n, 16)
    db = _f16(b[:, :2]) * (0.5 + sc.float()) * 0.25  # (n, 16)
    signs = _bits8(b[:, 34:66]).reshape(n, 16, 2, 8)
    qh = (b[:, 66:74].long().unsqueeze(-1) >> torch.tensor([0, 2, 4, 6])) & 3  # (n, 8, 4)
    idx = b[:, 2:34].long() | (qh.reshape(n, 32) << 8)
    grid = _grid("IQ2S_GRID", 8)[idx].reshape(n, 16, 2, 8)
    torch.mul(db.reshape(n, 16, 1, 1) * grid, signs, out=out.view(n, 16, 2, 8))


def iq3_xxs(b: torch.Tensor, out: torch.Tensor) -> None:
    # d f16 | qs[64] grid indices (4 values each) | per 32: u32 of 4 x 7 sign bits, scale
    n = b.shape[0]
    s = _u32(b[:, 66:98])  # (n, 8)
    db = _f16(b[:, :2]) * (0.5 + (s >> 28).float()) * 0.5
    signs = _sign_bits()[(s.unsqueeze(-1) >> torch.tensor([0, 7, 14, 21])) & 0x7F]  # (n,8,4,8)
    grid = _grid("IQ3XXS_GRID", 4)[b[:, 2:66].long()].reshape(n, 8, 4, 8)
    torch.mul(db.reshape(n, 8, 1, 1) * grid, signs, out=out.view(n, 8, 4, 8))


def iq3_s(b: torch.Tensor, out: torch.Tensor) -> None:
    # d f16 | qs[64] | qh[8]: the 9th index bits | signs[32] | scales[4]: a nibble per 32
    n = b.shape[0]
    sc = b[:, 106:110].long()
    sc = torch.stack([sc & 15, sc >> 4], dim=-1).reshape(n, 8)
    db = _f16(b[:, :2]) * (1 + 2 * sc).float()  # (n, 8)
    signs = _bits8(b[:, 74:106]).reshape(n, 8, 4, 8)
    qh = (b[:, 66:74].long().unsqueeze(-1) >> torch.arange(8)) & 1  # (n, 8, 8)
    idx = b[:, 2:66].long() | (qh.reshape(n, 64) << 8)
    grid = _grid("IQ3S_GRID", 4)[idx].reshape(n, 8, 4, 8)
    torch.mul(db.reshape(n, 8, 1, 1) * grid, signs, out=out.view(n, 8, 4, 8))


def iq1_s(b: torch.Tensor, out: torch.Tensor) -> None:
    # d f16 | qs[32] grid index low bits | qh u16[8]: 4 x 3 high bits, 3-bit scale, delta sign
    n = b.shape[0]
    qh = _u16(b[:, 34:50])  # (n, 8)
    dl = _f16(b[:, :2]) * (2 * ((qh >> 12) & 7) + 1).float()  # (n, 8)
    delta = torch.where(qh & 0x8000 == 0, _DELTA, -_DELTA).reshape(n, 8, 1, 1)
    hi = (qh.unsqueeze(-1) >> torch.tensor([0, 3, 6, 9])) & 7  # (n, 8, 4)
    idx = b[:, 2:34].long() | (hi.reshape(n, 32) << 8)
    grid = _grid("IQ1S_GRID", 8, signed=True)[idx].reshape(n, 8, 4, 8)
    torch.mul(dl.reshape(n, 8, 1, 1), grid + delta, out=out.view(n, 8, 4, 8))


def iq1_m(b: torch.Tensor, out: torch.Tensor) -> None:
    # qs[32] | qh[16]: a nibble per 8 values (3 index bits, delta sign) | scales u16[4]: 3-bit
    # scales per 16 values, the fp16 d in their top nibbles
    n = b.shape[0]
    sc = _u16(b[:, 48:56])  # (n, 4)
    dbits = ((sc & 0xF000) >> torch.tensor([12, 8, 4, 0])).sum(-1, keepdim=True)  # disjoint
    d = dbits.to(torch.int16).view(torch.float16).to(torch.float32)  # (n, 1)
    s3 = (sc.unsqueeze(-1) >> torch.tensor([0, 3, 6, 9])) & 7  # (n, 4, 4)
    dl = (d * (2 * s3.reshape(n, 16) + 1).float()).reshape(n, 8, 2, 1, 1)
    qh = b[:, 32:48].long().unsqueeze(-1) >> torch.tensor([0, 4])  # (n, 16, 2)
    idx = b[:, :32].long() | ((qh & 7).reshape(n, 32) << 8)
    delta = torch.where(qh & 8 == 0, _DELTA, -_DELTA).reshape(n, 8, 2, 2, 1)
    grid = _grid("IQ1S_GRID", 8, signed=True)[idx].reshape(n, 8, 2, 2, 8)
    torch.mul(dl, grid + delta, out=out.view(n, 8, 2, 2, 8))


BLOCK_FNS = {16: iq2_xxs, 17: iq2_xs, 22: iq2_s, 18: iq3_xxs, 21: iq3_s, 19: iq1_s, 29: iq1_m}
