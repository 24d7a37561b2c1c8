"""Dequantization of the non-linear and ternary ggml types (IQ4_NL, IQ4_XS, MXFP4, TQ1_0,
TQ2_0) in torch, bit-identical to gguf-py's numpy reference (`gguf.quants`): the same
float32 products in the same order. Each decoder reads (n, type_size) uint8 blocks and
writes (n, block_size) float32 into ``out``; `dequant.py` dispatches to them."""

from __future__ import annotations

import torch

# ggml-common.h's kvalues_iq4nl and kvalues_mxfp4 (e2m1 doubled)
IQ4NL_VALUES = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                             113], dtype=torch.float32)  # fmt: skip
MXFP4_VALUES = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                            dtype=torch.float32)  # fmt: skip
_POW3 = torch.tensor([1, 3, 9, 27, 81], dtype=torch.int32)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 little-endian halves -> (n, 1) float32 (finite scales)."""
    return b.clone(memory_format=torch.contiguous_format).view(torch.float16).to(torch.float32)


def _nib(qs: torch.Tensor) -> torch.Tensor:
    """(n, k) uint8 -> (n, 2k) long: the k low nibbles, then the k high nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1).long()


def iq4_nl(b: torch.Tensor, out: torch.Tensor) -> None:
    # block of 32: d f16 | 16 bytes of nibbles indexing kvalues_iq4nl
    torch.mul(_f16(b[:, :2]), IQ4NL_VALUES[_nib(b[:, 2:])], out=out)


def iq4_xs(b: torch.Tensor, out: torch.Tensor) -> None:
    # block of 256: d f16 | scales_h u16 | scales_l[4] | 128 bytes of nibbles; per 32 values
    # a 6-bit scale ls (low 4 bits in scales_l, high 2 in scales_h), dl = d * (ls - 32)
    n = b.shape[0]
    sh = b[:, 2:4].clone(memory_format=torch.contiguous_format)  # own storage: offset 0
    sh = sh.view(torch.int16).int() & 0xFFFF  # (n, 1)
    sl = b[:, 4:8].long()
    lo = torch.stack([sl & 0x0F, sl >> 4], dim=-1).reshape(n, 8)  # sub-block j: byte j/2
    hi = (sh >> (2 * torch.arange(8))) & 3  # (n, 8)
    ls = (lo | (hi << 4)) - 32
    dl = (_f16(b[:, :2]) * ls.float()).unsqueeze(-1)  # (n, 8, 1)
    qs = b[:, 8:].reshape(n, 8, 16)
    q = IQ4NL_VALUES[torch.cat([qs & 0x0F, qs >> 4], dim=-1).long()]  # (n, 8, 32)
    torch.mul(dl, q, out=out.view(n, 8, 32))


def mxfp4(b: torch.Tensor, out: torch.Tensor) -> None:
    # block of 32: e8m0 exponent e | 16 bytes of nibbles indexing kvalues_mxfp4; the scale is
    # ggml's e8m0_to_fp32_half: 2^(e - 128) as float32 bits (subnormal for e < 2)
    e = b[:, :1].int()
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    d = bits.view(torch.float32)  # (n, 1)
    torch.mul(d, MXFP4_VALUES[_nib(b[:, 1:])], out=out)


def tq2_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block of 256: 64 bytes of four 2-bit fields (q + 1) | d f16; bits 2l of byte 32k + j
    # hold value 128k + 32l + j
    n = b.shape[0]
    qs = b[:, :64].reshape(n, 2, 1, 32).int()
    q = ((qs >> (2 * torch.arange(4)).reshape(1, 1, 4, 1)) & 3).reshape(n, 256) - 1
    torch.mul(_f16(b[:, 64:66]), q.float(), out=out)


def tq1_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block of 256: 48 bytes of five trits | 4 bytes of four trits | d f16; a trit is
    # ((byte * 3^k mod 256) * 3) >> 8, minus 1
    n = b.shape[0]
    qs0 = (b[:, :32].int().reshape(n, 1, 32) * _POW3.reshape(1, 5, 1)).reshape(n, 160)
    qs1 = (b[:, 32:48].int().reshape(n, 1, 16) * _POW3.reshape(1, 5, 1)).reshape(n, 80)
    qh = (b[:, 48:52].int().reshape(n, 1, 4) * _POW3[:4].reshape(1, 4, 1)).reshape(n, 16)
    q = ((torch.cat([qs0, qs1, qh], dim=1) & 0xFF) * 3 >> 8) - 1
    torch.mul(_f16(b[:, 52:54]), q.float(), out=out)


BLOCK_FNS = {20: iq4_nl, 23: iq4_xs, 39: mxfp4, 34: tq1_0, 35: tq2_0}
