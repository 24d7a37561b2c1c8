"""The chunked gated delta rule (kernels/gdn_chunk.c) gives the same bits whatever vector
width it is built for: the library of this machine against deltanet.c + gdn_chunk.c built
for AVX2 (no AVX-512: its row-major decode tiles) and for plain x86-64 (SSE2: every row on
the transposed state), prompts and single decode rows, widths with and without ragged
lane blocks."""

from __future__ import annotations

import ctypes
import platform
import subprocess
from pathlib import Path

import pytest
import torch

from loraserve.cbuild_env import SRC_DIR, _compiler
from loraserve.kernels import gdn_chunk as gc

pytestmark = pytest.mark.skipif(
    not (gc.available() and _compiler()) or platform.machine() not in ("x86_64", "AMD64"),
    reason="C kernels or an x86-64 C compiler not available here",
)

BUILDS = {"avx2": ["-march=native", "-mno-avx512f"], "sse2": ["-march=x86-64"]}
STUBS = """
int ls_gated_act(const float *g, const float *u, int64_t T, int64_t F, int64_t ld, int act,
                 float *out, int nthreads) { return -1; }
int ls_rms_norm(const float *x, int64_t T, int64_t H, int64_t K, int64_t ldt, const float *w,
                int64_t HW, float eps, float *y, int nthreads) { return -1; }
"""  # deltanet.c's decode step calls these (rowops.c, layers.c); the test never does


def _build(tmp: Path, name: str) -> ctypes.CDLL:
    """deltanet.c + gdn_chunk.c (no OpenMP: one thread) for the target of BUILDS[name]."""
    unit, out = tmp / f"gdn_{name}.c", tmp / f"gdn_{name}.so"
    unit.write_text(f'#include "{SRC_DIR / "deltanet.c"}"\n#include "{SRC_DIR / "gdn_chunk.c"}"\n'
                    + STUBS)  # fmt: skip
    flags = ["-O3", "-ffp-contract=off", "-fPIC", "-shared", "-std=c11", "-Wno-psabi",
             "-Wno-unknown-pragmas", f"-I{SRC_DIR}", *BUILDS[name]]  # fmt: skip
    subprocess.run([_compiler(), *flags, str(unit), "-o", str(out), "-lm"], check=True,
                   capture_output=True)  # fmt: skip
    lib = ctypes.CDLL(str(out))
    lib.ls_gdn_chunk.argtypes, lib.ls_gdn_chunk.restype = gc._SIGNATURES["ls_gdn_chunk"]
    return lib


def _call(lib: ctypes.CDLL, x: dict, lo: int, n: int, rec: torch.Tensor, c: int) -> tuple:
    """Rows lo .. lo + n - 1 from rec: (o rows, new record, the record after its first row)."""
    t, h, s = x["q"].shape
    out, snap, o = torch.empty_like(rec), torch.empty_like(rec), torch.zeros(t, h, s)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    rc = lib.ls_gdn_chunk(
        1, (i64 * 1)(lo), (i64 * 1)(n), (ptr * 1)(rec.data_ptr()), (ptr * 1)(out.data_ptr()),
        x["q"].data_ptr(), x["k"].data_ptr(), x["v"].data_ptr(), h * s, x["lg"].data_ptr(),
        x["beta"].data_ptr(), 0.125, o.data_ptr(), h, s, c, (i64 * 2)(0, 1), (i64 * 1)(0),
        (ptr * 1)(snap.data_ptr()), 1,
    )  # fmt: skip
    assert rc == 0
    return o[lo : lo + n], out, snap


def _runs(lib: ctypes.CDLL, h: int, s: int, c: int, t: int) -> list[torch.Tensor]:
    """A prompt of t - 5 rows, then 5 decode rows one call each: every output and record."""
    gen = torch.Generator().manual_seed(t * s)
    unit = [torch.nn.functional.normalize(torch.randn(t, h, s, generator=gen), dim=-1)
            for _ in range(2)]  # fmt: skip
    lg, beta = -2 * torch.rand(t, h, generator=gen), torch.rand(t, h, generator=gen)
    x = dict(q=unit[0], k=unit[1], v=torch.randn(t, h, s, generator=gen), lg=lg, beta=beta)
    got, rec = [], torch.zeros(gc.record_size(h, s, c))
    for lo, n in [(0, t - 5), *((r, 1) for r in range(t - 5, t))]:
        o, rec, snap = _call(lib, x, lo, n, rec, c)
        got += [o, rec, snap]
    return got


def test_same_bits_for_every_vector_width(tmp_path: Path) -> None:
    cases = [(2, 128, 16, 40), (3, 20, 4, 23), (2, 48, 16, 37), (1, 16, 1, 9)]
    ref = gc._c()
    for name in BUILDS:
        lib = _build(tmp_path, name)
        for h, s, c, t in cases:
            for want, got in zip(_runs(ref, h, s, c, t), _runs(lib, h, s, c, t), strict=True):
                assert torch.equal(want.view(torch.int32), got.view(torch.int32)), (name, s, c)
