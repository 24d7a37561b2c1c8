"""The chunked Mamba-2 scan (kernels/ssd_chunk.c) gives the same bits whatever vector width
it is built for: the library of this machine against ssd_chunk.c built alone for AVX2 (no
AVX-512) and for plain x86-64 (SSE2), on shapes with and without ragged edges."""

from __future__ import annotations

import ctypes
import platform
import subprocess
from pathlib import Path

import pytest
import torch

from loraserve.cbuild_env import SRC_DIR, _compiler
from loraserve.kernels import ssd_chunk as sc
from loraserve.kernels import ssm_scan

pytestmark = pytest.mark.skipif(
    not (sc.available() and ssm_scan.available() and _compiler())
    or platform.machine() not in ("x86_64", "AMD64"),
    reason="C kernels or an x86-64 C compiler not available here",
)

BUILDS = {"avx2": ["-march=native", "-mno-avx512f"], "sse2": ["-march=x86-64"]}


def _build(tmp: Path, name: str) -> ctypes.CDLL:
    """ssd_chunk.c alone (no OpenMP: one thread) for the target of BUILDS[name]."""
    out = tmp / f"ssd_{name}.so"
    flags = ["-O3", "-ffp-contract=off", "-fPIC", "-shared", "-std=c11", "-Wno-psabi",
             "-Wno-unknown-pragmas", *BUILDS[name]]  # fmt: skip
    subprocess.run([_compiler(), *flags, str(SRC_DIR / "ssd_chunk.c"), "-o", str(out), "-lm"],
                   check=True, capture_output=True)  # fmt: skip
    lib = ctypes.CDLL(str(out))
    lib.ls_ssd_chunk.argtypes, lib.ls_ssd_chunk.restype = sc._SIGNATURES["ls_ssd_chunk"]
    return lib


def _run(lib: ctypes.CDLL, dims: tuple[int, ...], c: int, t: int) -> tuple[torch.Tensor, ...]:
    h, p, n, g = dims
    gen = torch.Generator().manual_seed(t)
    width = h * p + 2 * g * n
    xbc = torch.randn(t, width, generator=gen)
    a = -torch.rand(h, generator=gen) * 3
    dt, _ = ssm_scan.dt_da(torch.randn(t, h, generator=gen), torch.zeros(h), a)
    lg = dt * a
    size = sc.record_size(h, p, n, c)
    rec, out, snap = torch.zeros(size), torch.empty(size), torch.empty(size)
    y = torch.empty(t, h, p)
    i64 = ctypes.c_int64
    rc = lib.ls_ssd_chunk(
        1, (i64 * 1)(0), (i64 * 1)(t), (ctypes.c_void_p * 1)(rec.data_ptr()),
        (ctypes.c_void_p * 1)(out.data_ptr()), xbc.data_ptr(), width, dt.data_ptr(),
        lg.data_ptr(), y.data_ptr(), h, p, n, g, c, (i64 * 2)(0, 1), (i64 * 1)(t // 2),
        (ctypes.c_void_p * 1)(snap.data_ptr()), 1,
    )  # fmt: skip
    assert rc == 0
    return y, out, snap


def test_same_bits_for_every_vector_width(tmp_path: Path) -> None:
    cases = [((4, 64, 128, 1), 16, 40), ((6, 5, 13, 3), 4, 23), ((2, 17, 33, 2), 16, 37),
             ((3, 8, 48, 1), 1, 9)]  # fmt: skip
    ref = sc._c()
    for name in BUILDS:
        lib = _build(tmp_path, name)
        for dims, c, t in cases:
            for want, got in zip(_run(ref, dims, c, t), _run(lib, dims, c, t), strict=True):
                assert torch.equal(want.view(torch.int32), got.view(torch.int32)), (name, dims)
