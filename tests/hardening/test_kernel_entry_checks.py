"""Every C entry point checks its sizes and returns an error rather than trusting its caller
(issue 31 item 1): called directly with sizes that do not fit (a zero norm-weight count, rows
closer than their width, a span or snapshot row outside its sequence, an expert count of 0,
query rows narrower than their heads), each returns its error code before touching memory
(the pointers are null: the old code crashed on them), and the Python wrappers turn a
refusal into a ValueError."""

from __future__ import annotations

import ctypes
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


# The recurrent, packed-tile and expert-stage entry points (conv step, selective scans, the
# scans' row sum, Mamba-2's fused decode step, latent attention's prep, packed tiles,
# decoded-group tasks, the one-part matmul, expert activation and combine): null pointers
# with sizes that do not fit return -3 (the old code read them and died), and a call with
# sizes that fit still runs (returns 0: a refusal of a valid call would quietly push the
# matmuls onto their slower fallbacks).
PROBE2 = r"""
import ctypes, json
from loraserve import kernels
from loraserve.kernels import deltanet, mla, moe, ssm_scan
k, d, s, m = kernels._c(), deltanet._c(), ssm_scan._c(), moe._c()
if None in (k, d, s, m) or not mla.available():
    print(json.dumps(None)); raise SystemExit
P, I, C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
for f, n in (("ls_packed_tile", 0), ("ls_packed_tile2", 1)):
    getattr(k, f).argtypes = [C, P] + [I] * n + [P, P, P, I, C, C, P, I]
    getattr(k, f).restype = C
k.ls_kbytes_task.argtypes = [C, C, P, I, I, I, I, P, P, P, I, P, I, P]
k.ls_kbytes_task.restype = C
k.ls_kbytes_scratch.argtypes, k.ls_kbytes_scratch.restype = [I, I], I
N = None
one, two = (I * 1)(0), (I * 1)(2)
off0, off1 = (I * 2)(0, 0), (I * 2)(0, 1)
Q8_0, Q4_K, Q6_K = 8, 12, 14
out = {
    "conv_step null rows": d.ls_conv_step(N, N, N, N, 4, 2, N, N, N, N),
    "conv_step C=0": d.ls_conv_step(N, N, N, N, 0, 2, N, N, N, N),
    "ssm_rowsum vl=99": s.ls_ssm_rowsum(N, 1, 8, 99, N),
    "ssm_scan2 G does not divide H": s.ls_ssm_scan2(
        N, 64, N, N, 3, 4, 8, 2, 1, one, two, N, N, N, off0, N, N, 8, 1),
    "ssm_scan2 ldx < H P + 2 G N": s.ls_ssm_scan2(
        N, 8, N, N, 2, 4, 8, 1, 1, one, two, N, N, N, off0, N, N, 8, 1),
    "ssm_scan2 N too wide for its stack": s.ls_ssm_scan2(
        N, 1 << 40, N, N, 1, 1, 1 << 30, 1, 1, one, two, N, N, N, off0, N, N, 8, 1),
    "ssm_scan2 snapshot row outside": s.ls_ssm_scan2(
        N, 64, N, N, 2, 4, 8, 1, 1, one, two, N, N, (I * 1)(5), off1, N, N, 8, 1),
    "ssm_scan1 span backwards": s.ls_ssm_scan1(
        N, N, N, N, N, 4, 8, 1, two, one, 0, 2, N, N, off0, N, N, 8, 1),
    "ssm_scan1 r1 < r0": s.ls_ssm_scan1(
        N, N, N, N, N, 4, 8, 1, one, two, 2, 0, N, N, off0, N, N, 8, 1),
    "packed_tile R=0": k.ls_packed_tile(Q8_0, N, N, N, N, 32, 0, 0, N, 8),
    "packed_tile K not blocks": k.ls_packed_tile(Q4_K, N, N, N, N, 100, 1, 0, N, 8),
    "packed_tile2 gb < group": k.ls_packed_tile2(Q4_K, N, 0, N, N, N, 256, 1, 0, N, 16),
    "kbytes_task short rows": k.ls_kbytes_task(Q6_K, 0, N, 10, 0, 1, 256, N, N, N, 1, N, 8, N),
    # Q8_0 rows of 1 byte for 32 values, 4 activation rows: the scales were read first
    "qmatmul short rows": k.ls_qmatmul(Q8_0, N, 8, 32, 1, N, N, N, N, 4, N, 8, 1),
    "moe_act offsets descending": m.ls_moe_act(N, 2, (I * 3)(0, 4, 2), 32, N, N, 0, N, 1),
    "moe_combine position outside": m.ls_moe_combine(
        N, 32, 1, 2, (I * 2)(0, 1), (I * 2)(0, 9), N, N, N, 1),
    # Mamba-2's decode step with 3 heads in 2 groups; latent attention with an odd rope width
    "mamba2_step G does not divide H": s.ls_mamba2_step(
        N, 64, N, N, 1, N, N, N, N, N, N, N, 1e-6, 3, 4, 8, 2, 4, N, 8, 1),
    "mla_prep odd rope width": mla._lib[0].ls_mla_prep(
        N, 64, N, 64, N, 0, 8, 1, 2, 16, 8, 3, N, N, 1e-6, N, N, N, 1, N, 64, 0, N, 1),
}
# calls whose sizes fit, on zeroed buffers: each returns 0
import torch
K = 256
x = torch.zeros(K, dtype=torch.int8)
xd = torch.zeros(K // 32)
bs = torch.zeros(K // 16, dtype=torch.int16)
y = torch.zeros(16)
g = torch.zeros(2 * 8 * 210, dtype=torch.uint8)
buf = torch.zeros(k.ls_kbytes_scratch(K, 1) + 64, dtype=torch.uint8)
ab = buf.data_ptr() + (-buf.data_ptr()) % 64
out["packed_tile fits"] = k.ls_packed_tile(Q8_0, g.data_ptr(), x.data_ptr(), xd.data_ptr(),
                                           bs.data_ptr(), K, 1, 0, y.data_ptr(), 8)
out["kbytes_task fits"] = k.ls_kbytes_task(Q6_K, 0, g.data_ptr(), 210, 0, 1, K, x.data_ptr(),
                                           xd.data_ptr(), bs.data_ptr(), 1, y.data_ptr(), 8, ab)
from loraserve.kernels import attention
at = attention._lib()
# fp16-pool attention with query rows 4 apart for 2 heads of 8 (what ls_attention_ex refuses)
out["attention_f16 ldq<H*D"] = at.ls_attention_f16(
    N, 4, N, 8, N, 8, 0, N, off0, 0, N, N, 0, 1.0, 0.0, N, N, 0, 2, 1, 8, 8, 1)
print(json.dumps(out))
"""


def test_recurrent_and_tile_entry_points_refuse_sizes_that_do_not_fit() -> None:
    run = subprocess.run(
        [sys.executable, "-c", PROBE2], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"the probe died ({run.returncode}): {run.stderr[-2000:]}"
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if got is None:
        pytest.skip("no C kernels on this machine")
    fits = {name: got.pop(name) for name in ("packed_tile fits", "kbytes_task fits")}
    assert got.pop("attention_f16 ldq<H*D") == -1  # its code for metadata that does not fit
    assert set(got.values()) == {-3}, got
    assert fits["packed_tile fits"] == 0
    assert fits["kbytes_task fits"] in (0, -1)  # -1: a build without these tiles (no AVX2)


def test_scan_wrappers_turn_a_refusal_into_an_error() -> None:
    from loraserve.kernels import deltanet, ssm_scan

    if not ssm_scan.available() or not deltanet.available():
        pytest.skip("no C kernels on this machine")
    with pytest.raises(ValueError, match="ssm_scan2: sizes that do not fit"):
        # three heads in two groups
        ssm_scan.scan2(torch.zeros(2, 64), torch.zeros(2, 3), torch.zeros(2, 3), (3, 4, 8, 2),
                       [(0, 2)], [torch.zeros(3, 4, 8)], [[]])  # fmt: skip
    with pytest.raises(ValueError, match="ssm_scan1: sizes that do not fit"):
        d, n = 4, 8  # a snapshot row past its sequence's 2 rows (the wrapper checks spans)
        ssm_scan.scan1(torch.zeros(2, d), torch.zeros(2, d), torch.zeros(d, n),
                       torch.zeros(2, n), torch.zeros(2, n), [(0, 2)],
                       [torch.zeros(d, n)], [[5]])  # fmt: skip


# The delta-net decode step, its gates and the gated attention's output gate (issue 28's C
# entry points): null pointers, a spec whose key heads do not divide its value heads, rows
# narrower than the mixer's, beta/alpha columns past the row (the old step checked them
# against the row stride from the gates' start, C + Hv S values into the row, so the last
# 2 Hv + C + Hv S - 1 columns it accepted were read past the row) return -3; calls that fit,
# 0.
PROBE3 = r"""
import ctypes, json
import torch
from loraserve.kernels import deltanet
from loraserve.kernels.layers import bind, _SIGNATURES
from loraserve.kernels.layers_abi import GdnC
d, lay = deltanet._c(), bind(_SIGNATURES)
if None in (d, lay):
    print(json.dumps(None)); raise SystemExit
N, I = None, ctypes.c_int64
buf = torch.zeros(4096)
p = buf.data_ptr()
cols = (I * 4)(0, 1, 2, 3)
far = (I * 4)(0, 1, 2, 60)  # inside a 64-wide row from its start, past its last 4 values
def spec(hk=1, hv=2, s=8, cols=cols):
    return GdnC(p, p, p, p, p, p, ctypes.addressof(cols), 1e-6, 1e-6, 0.35, hk, hv, s, 4, 0)
ptrs = (ctypes.c_void_p * 1)(p)
ok, bad_heads, past = (ctypes.byref(x) for x in (spec(), spec(hk=2, hv=3), spec(cols=far)))
W = 2 * 1 * 8 + 2 * 8 + 2 * 8 + 4  # q|k|v, z, beta|alpha of 1 key head, 2 value heads of 8
out = {
    "gdn_step null spec": d.ls_gdn_step(p, W, 1, ptrs, ptrs, N, p, 1),
    "gdn_step Hk does not divide Hv": d.ls_gdn_step(p, 64, 1, ptrs, ptrs, bad_heads, p, 1),
    "gdn_step rows narrower than the mixer": d.ls_gdn_step(p, W - 1, 1, ptrs, ptrs, ok, p, 1),
    "gdn_step beta/alpha column past the row": d.ls_gdn_step(p, 64, 1, ptrs, ptrs, past, p, 1),
    "gdn_step null state": d.ls_gdn_step(p, W, 1, (ctypes.c_void_p * 1)(N), ptrs, ok, p, 1),
    "gdn_step T=0": d.ls_gdn_step(p, W, 0, ptrs, ptrs, ok, p, 1),
    "gdn_gates null rows": d.ls_gdn_gates(N, 4, 1, 2, cols, p, p, p, p),
    "gdn_gates H=0": d.ls_gdn_gates(p, 4, 1, 0, cols, p, p, p, p),
    "gdn_gates column past the row": d.ls_gdn_gates(p, 3, 1, 2, cols, p, p, p, p),
    "gdn_gates T<0": d.ls_gdn_gates(p, 4, -1, 2, cols, p, p, p, p),
    "sigmoid_gate null rows": lay.ls_sigmoid_gate(N, 8, p, 8, 8, 1, 1, 8, p),
    "sigmoid_gate D=0": lay.ls_sigmoid_gate(p, 8, p, 8, 8, 1, 1, 0, p),
    "sigmoid_gate lda<H*D": lay.ls_sigmoid_gate(p, 8, p, 16, 8, 1, 2, 8, p),
    "sigmoid_gate head stride<D": lay.ls_sigmoid_gate(p, 16, p, 16, 4, 1, 2, 8, p),
}
fits = {
    "gdn_step": d.ls_gdn_step(p, W, 1, ptrs, (ctypes.c_void_p * 1)(p + 4 * 2048),
                              ok, p + 4 * 3072, 1),
    "gdn_gates": d.ls_gdn_gates(p, 4, 2, 2, cols, p, p, p + 64, p + 128),
    "sigmoid_gate": lay.ls_sigmoid_gate(p, 16, p, 16, 8, 2, 2, 8, p + 64),
}
print(json.dumps([out, fits]))
"""


def test_delta_net_step_gate_entry_points_refuse_sizes_that_do_not_fit() -> None:
    run = subprocess.run(
        [sys.executable, "-c", PROBE3], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"the probe died ({run.returncode}): {run.stderr[-2000:]}"
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if got is None:
        pytest.skip("no C kernels on this machine")
    refused, fits = got
    assert refused == dict.fromkeys(refused, -3) and len(refused) == 14, refused
    assert fits == {"gdn_step": 0, "gdn_gates": 0, "sigmoid_gate": 0}


def test_recurrent_wrappers_refuse_crafted_inputs() -> None:
    """The recurrent kernels' Python wrappers check what the C code cannot (a tensor's dtype,
    width and row count, one state per span): each crafted call raises ValueError before C
    runs (the old wrappers passed these on: writes past y or a state, reads past a row)."""
    from loraserve.kernels import deltanet, ssm_scan
    from loraserve.kernels.layers_abi import GdnC

    if not ssm_scan.available() or not deltanet.available():
        pytest.skip("no C kernels on this machine")
    z = torch.zeros
    st = [z(2, 8, 8)]
    recur = (z(3, 2, 8), z(3, 2, 8), z(3, 2, 8), z(3, 2), z(3, 2), 0.3, z(3, 2, 8))
    xbc, dt = z(4, 2 * 4 + 2 * 8), z(4, 2)
    calls = {
        "2 spans but": lambda: deltanet.gdn_recur([(0, 2), (2, 3)], st * 2, st, *recur, [[], []]),
        "outside 3 rows": lambda: deltanet.gdn_recur([(0, 4)], st, st, *recur, [[]]),
        "a CPU float32 tensor": lambda: deltanet.gdn_recur(
            [(0, 3)], [z(2, 8, 8).half()], st, *recur, [[]]
        ),  # fmt: skip
        "bias": lambda: deltanet.conv_step(z(8), z(4), z(3, 4), z(2), z(4), z(8)),
        "dt_b": lambda: deltanet.gdn_gates(z(2, 4), torch.arange(4), z(2).half(), z(2)),
        "columns": lambda: deltanet.gdn_gates(z(4, 8)[:, :2], torch.arange(4), z(2), z(2)),
        "spec": lambda: deltanet.gdn_step(z(1, 64), [z(10)], [z(10)], ctypes.c_int(0), 10),
        "state_size": lambda: deltanet.gdn_step(
            z(1, 64),
            [z(10)],
            [z(10)],
            GdnC(None, None, None, None, None, None, None, 0, 0, 0, 1, 2, 8, 4, 0),
            10,
        ),  # fmt: skip
        "scan2: row spans": lambda: ssm_scan.scan2(
            xbc, dt, dt, (2, 4, 8, 1), [(0, 9)], [z(2, 4, 8)], [[]]
        ),  # fmt: skip
        "scan2: dt": lambda: ssm_scan.scan2(
            xbc, dt[:2], dt, (2, 4, 8, 1), [(0, 4)], [z(2, 4, 8)], [[]]
        ),  # fmt: skip
        "xbc": lambda: ssm_scan.scan2(
            xbc[:, :20], dt, dt, (2, 4, 8, 1), [(0, 4)], [z(2, 4, 8)], [[]]
        ),  # fmt: skip
        "finals": lambda: ssm_scan.scan2(
            xbc, dt, dt, (2, 4, 8, 1), [(0, 4)], [z(2, 4, 8)], [[]], z(1, 2, 4, 8).half()
        ),  # fmt: skip
        "scan1: b": lambda: ssm_scan.scan1(
            z(4, 4), z(4, 4), z(4, 8), z(2, 8), z(4, 8), [(0, 4)], [z(4, 8)], [[]]
        ),  # fmt: skip
        "mamba2_step: dt": lambda: ssm_scan.mamba2_step(
            z(1, 32),
            z(1, 1),
            z(1, 2),
            (4, 2, 4, 8, 1),
            [z(3 * 24 + 64)],
            [z(3 * 24 + 64)],
            (z(4, 24), None, z(24), z(2), None),
            1e-6,
        ),  # fmt: skip
        "dt_da: bias": lambda: ssm_scan.dt_da(z(3, 2), z(2).double(), z(2)),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError, match=what):
            call()
