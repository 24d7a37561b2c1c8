"""LoRA deltas from float16 A and B (`lora16.c`): `floatmm.lora_delta`'s bits from half
the bytes, for adapters whose file stored them as halves, with no float32 copy held. B is
read in tiles of 8 outputs (`tiles`), one sequential stream per adapter, and the outputs
past the last whole tile from its `tail` rows."""

from __future__ import annotations

import ctypes

import torch

from loraserve.cbuild import bind

_P, _I, _CI = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "ls_lora16": ([_CI, _P, _P, _P, _P, _P, _P, _I, _I, _I, _P, _I, _I, _CI], _CI),
    "ls_lora16_hold": ([_CI, _P, _P, _P, _P, _P, _P, _P, _P], _CI),
}
_lib: list[ctypes.CDLL | None] = []

Halves = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # A16, `tiles`(B), `tail`(B)


def tiles(b: torch.Tensor) -> torch.Tensor:
    """B [out, r] -> float16 [out // 8, r, 8]: tile t holds B[8t + i, j] at [t, j, i] (the
    outputs past the last whole tile are in `tail`); always a copy of its own."""
    n8 = b.shape[0] // 8 * 8
    tiled = b[:n8].reshape(n8 // 8, 8, b.shape[1]).transpose(1, 2)
    return tiled.to(torch.float16, memory_format=torch.contiguous_format, copy=True)


def tail(b: torch.Tensor) -> torch.Tensor:
    """B [out, r] -> its rows past the last whole tile, float16 [out % 8, r], a tensor of
    its own (an empty slice of B kept all of B's storage alive: the file's mapping, or
    a float16 B's copy, held beside its tiles)."""
    return b[b.shape[0] // 8 * 8 :].to(torch.float16, copy=True).contiguous()


def hold(
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[list[Halves], bool, torch.Tensor]:
    """Each float16 pair (A [r, in], B [out, r], both contiguous, e.g. views of a file's
    mapping) copied into its held form, (A, `tiles`(B), `tail`(B)), all in one call off
    the GIL that also checks the values: (the halves, whether every value is finite, the
    arena). The same halves as ``(a.clone(), tiles(b), tail(b))``, in one pass over the
    bytes, held as views of one float16 arena [sum of their sizes], back to back in the
    pairs' order, no gap: its bytes are every half held, so one hash of them covers the
    whole (`lora.adapter`), and it is freed with the last view."""
    if not available():
        raise RuntimeError("lora16.hold needs the compiled kernels")
    lib = _lib[0]
    assert lib is not None
    sizes = []
    for a, b in pairs:
        r, k = a.shape
        n = b.shape[0]
        if (a.dtype != torch.float16 or b.dtype != torch.float16 or a.dim() != 2
                or tuple(b.shape) != (n, r) or not a.is_contiguous()
                or not b.is_contiguous()):  # fmt: skip
            raise ValueError(f"lora16.hold: A {tuple(a.shape)}, B {tuple(b.shape)}")
        sizes.append((r, k, n))
    arena = torch.empty(sum(r * (k + n) for r, k, n in sizes), dtype=torch.float16)
    out: list[Halves] = []
    at = 0
    for r, k, n in sizes:  # A [r, k], tiles [n // 8, r, 8], tail [n % 8, r]
        n8 = n // 8 * 8
        a16 = arena.as_strided((r, k), (k, 1), at)
        bt = arena.as_strided((n // 8, r, 8), (r * 8, 8, 1), at + r * k)
        rest = arena.as_strided((n - n8, r), (r, 1), at + r * (k + n8))
        out.append((a16, bt, rest))
        at += r * (k + n)
    m = len(pairs)

    def ptrs(ts: list[torch.Tensor]) -> ctypes.Array:
        return (ctypes.c_void_p * m)(*[t.data_ptr() for t in ts])

    def ints(xs: list[int]) -> ctypes.Array:
        return (ctypes.c_int64 * m)(*xs)

    rc = lib.ls_lora16_hold(
        m, ptrs([a for a, _ in pairs]), ptrs([b for _, b in pairs]),
        ints([r for r, _, _ in sizes]), ints([k for _, k, _ in sizes]),
        ints([n for _, _, n in sizes]), ptrs([h[0] for h in out]),
        ptrs([h[1] for h in out]), ptrs([h[2] for h in out]),
    )  # fmt: skip
    if rc < 0:
        raise ValueError("lora16.hold: sizes do not fit")
    return out, rc == 0, arena


def untile(bt: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """`tiles` and `tail` back to B [out, r] float16 (the same halves)."""
    r = bt.shape[1]
    return torch.cat([bt.transpose(1, 2).reshape(bt.shape[0] * 8, r), rest])


def available() -> bool:
    """Whether the compiled kernel is here (else `floatmm.lora_delta` serves)."""
    if not _lib:
        _lib.append(bind(_SIGNATURES))
    return _lib[0] is not None


def lora_delta16(
    x: torch.Tensor, y: torch.Tensor, adapters: list[Halves], scales: torch.Tensor
) -> torch.Tensor:
    """y [T, out] += each adapter's ``B (s * (A x))`` in the order given, as
    `floatmm.lora_delta` computes it from float32 A and B (the same bits): A16 [r, in],
    B's `tiles` [out // 8, r, 8] and `tail` [out % 8, r], all float16 contiguous; x [T, in]
    float32; scales [n, T] float32 (0 where a row lacks the adapter); y may be a column
    slice."""
    if not available():
        raise RuntimeError("lora_delta16 needs the compiled kernels")
    lib = _lib[0]
    assert lib is not None
    t, k = x.shape
    n_out, n = y.shape[1], len(adapters)
    if x.dtype != torch.float32 or y.dtype != torch.float32 or y.shape[0] != t:
        raise ValueError(f"lora_delta16: x {tuple(x.shape)}, y {tuple(y.shape)} float32 rows")
    for a16, bt16, rest in adapters:
        r = a16.shape[0]
        ok = (a16.dtype == bt16.dtype == rest.dtype == torch.float16
              and tuple(a16.shape) == (r, k) and tuple(bt16.shape) == (n_out // 8, r, 8)
              and tuple(rest.shape) == (n_out % 8, r) and a16.is_contiguous()
              and bt16.is_contiguous() and rest.is_contiguous())  # fmt: skip
        if not ok:
            raise ValueError(
                f"lora_delta16: A16 {tuple(a16.shape)}, B tiles {tuple(bt16.shape)} and tail "
                f"{tuple(rest.shape)} do not fit x [T, {k}] and y [T, {n_out}]"
            )
    if tuple(scales.shape) != (n, t):
        raise ValueError(f"lora_delta16: scales {tuple(scales.shape)} for {n} adapters, {t} rows")
    if t == 0 or n == 0:
        return y
    if x.stride(1) != 1:
        x = x.contiguous()
    if y.stride(1) != 1:
        raise ValueError("lora_delta16 needs a unit column stride for y")
    scales = scales.float().contiguous()
    as16 = (ctypes.c_void_p * n)(*[a.data_ptr() for a, _, _ in adapters])
    rests = (ctypes.c_void_p * n)(*[b.data_ptr() for _, _, b in adapters])
    bts = (ctypes.c_void_p * n)(*[bt.data_ptr() for _, bt, _ in adapters])
    ranks = (ctypes.c_int64 * n)(*[a.shape[0] for a, _, _ in adapters])
    ldx = x.stride(0) if t > 1 else k
    ldy = y.stride(0) if t > 1 else max(y.stride(0), n_out)
    rc = lib.ls_lora16(n, as16, rests, bts, ranks, scales.data_ptr(), x.data_ptr(), ldx, t, k,
                       y.data_ptr(), ldy, n_out, torch.get_num_threads())  # fmt: skip
    if rc == -3:
        raise ValueError("lora_delta16: sizes do not fit")
    if rc != 0:
        raise MemoryError("lora_delta16: out of memory")
    return y
