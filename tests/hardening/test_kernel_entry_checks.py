"""Every C entry point checks its sizes and returns an error rather than trusting its caller
(issue 31 item 1): called directly with sizes that do not fit (a zero norm-weight count, rows
closer than their width, a span or snapshot row outside its sequence, an expert count of 0,
query rows narrower than their heads), each returns its error code before touching memory
(the pointers are null: the old code crashed on them), and the Python wrappers turn a
refusal into a ValueError."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from loraserve.kernels import rowops

# each call with null pointers and sizes that do not fit: (name, code, expected return)
PROBE = r"""
import ctypes, json
from loraserve import kernels
from loraserve.kernels import deltanet, moe, rowops
r, k, d, m = rowops._c(), kernels._c(), deltanet._c(), moe._c()
if None in (r, k, d, m):
    print(json.dumps(None)); raise SystemExit
N = None
I = ctypes.c_int64
one = (I * 2)(0, 1)
out = {
    "rms_norm HW=0": r.ls_rms_norm(N, 1, 1, 8, 8, N, 0, 1e-6, N, 1),
    "rms_norm ldt<H*K": r.ls_rms_norm(N, 2, 2, 8, 8, N, 1, 1e-6, N, 1),
    "norm_rope odd K": r.ls_norm_rope(N, 1, 1, 7, 7, N, 1, 1e-6, N, N, N, 1),
    "layer_norm ldt<K": r.ls_layer_norm(N, 2, 8, 4, N, N, 1e-6, N, 1),
    "gated_act ld<F": r.ls_gated_act(N, N, 2, 8, 4, 0, N, 1),
    "softcap ld<V": r.ls_softcap(N, 2, 8, 4, ctypes.c_float(30.0), 1),
    "scan_rows V=0": r.ls_scan_rows(N, 1, 0, 0, N, N, 1),
    "quantize_rows ldx<K": k.ls_quantize_rows(N, 2, 64, 32, N, N, N, N, 1),
    "quantize_rows_k M<0": k.ls_quantize_rows_k(N, -1, 256, 256, N, N, N, N, 1),
    "moe_route E=0": m.ls_moe_route(1, 1, 0, N, N, N, N),
    # one sequence of 1 row whose snapshot is at its row 1 (outside it)
    "gdn_recur snapshot row": d.ls_gdn_recur(
        1, (I * 1)(0), (I * 1)(1), N, N, N, N, N, 4, N, N, ctypes.c_float(1.0), N, 1, 4,
        one, (I * 1)(1), N, 1),
}
print(json.dumps(out))
"""
WANT = {
    "rms_norm HW=0": -3,
    "rms_norm ldt<H*K": -3,
    "norm_rope odd K": -3,
    "layer_norm ldt<K": -3,
    "gated_act ld<F": -3,
    "softcap ld<V": -3,
    "scan_rows V=0": -3,
    "quantize_rows ldx<K": -3,
    "quantize_rows_k M<0": -3,
    "moe_route E=0": -3,
    "gdn_recur snapshot row": -3,
}


def test_entry_points_refuse_sizes_that_do_not_fit() -> None:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"the probe died ({run.returncode}): {run.stderr[-2000:]}"
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if got is None:
        pytest.skip("no C kernels on this machine")
    assert got == WANT


def test_wrappers_turn_a_refusal_into_an_error() -> None:
    if rowops._c() is None:
        pytest.skip("no C kernels on this machine")
    base = torch.arange(16, dtype=torch.float32)
    rows = base.as_strided((2, 8), (4, 1))  # rows 4 apart but 8 wide: they overlap
    with pytest.raises(ValueError, match="softcap: sizes that do not fit"):
        rowops.softcap_(rows, 30.0)
    with pytest.raises(ValueError, match="scan_rows: sizes that do not fit"):
        rowops.scan_rows(rows)
    # the same rows apart by their width pass, as before
    ok = base.view(2, 8)
    bad, top = rowops.scan_rows(ok)
    assert not bad.any() and top.tolist() == [7, 7]
