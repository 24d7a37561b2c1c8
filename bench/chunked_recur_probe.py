"""The loop interchange of the recurrences, as a standalone probe: the kernels' row blocks.

The gated delta rule is separable over the state's value rows: row i of M [S_v, S_k] runs
m_i <- g m_i + d_i k^T with d_i = beta (v_i - g m_i.k) and o_i = scale m_i.q, reading only its
own row and the token's k, q, g, beta. This probe runs blocks of R rows (R S floats, 32 KiB at
R = 64: L1) through every token of the prompt before the next block, with each row's float
operations those of `kernels/deltanet.c` in its order (lanes = rows, each dot product summed
over the key index from 0 upwards, no contraction). The same holds for Mamba-2's scan
(`kernels/ssm_scan.c`): rows p of a head's state [P, N] are independent, and y's sum over n
keeps `torch_sum`'s order with rows as lanes. It was the prototype (docs/chunked_scan.md);
the kernels now run prompts this way themselves (`ls_gdn_recur`, `ls_ssm_scan2`), and the
probe stays as an implementation written apart from them (`tests/unit/model/
test_recurrent_chunked.py` checks the kernels' bits against it) and an A/B of the two.

`python -m bench.chunked_recur_probe [--tokens 512] [--reps 3] [--threads 1] [--wall]`
compiles the probe (gcc, the project's flags) into a temporary directory, checks it bit for
bit against `kernels.deltanet.gdn_recur` and `kernels.ssm_scan.scan2` on `bench.chunked_scan`'s
qwen35- and granitehybrid-shaped inputs and prints both times per prompt (thread CPU at 1
thread; `--wall` under the bench lock): about 1.0x since the kernels carry the interchange.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from bench.chunked_scan import gdn_c, gdn_inputs, ssd_c, ssd_inputs, timed

SRC = r"""
#include <stdint.h>
#include <string.h>
#ifndef R
#define R 64
#endif
// q, k, v, o [T, H, S]; g, beta [T, H]; m_in, m_out [H, S, S] (M [S_v, S_k] per head)
int probe_gdn(int64_t T, int64_t H, int64_t S, const float *m_in, float *m_out,
              const float *q, const float *k, const float *v, const float *g,
              const float *beta, float scale, float *o, int nthreads) {
    if (S % R) return -3;
    const int64_t nb = S / R;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int64_t task = 0; task < H * nb; task++) {
        const int64_t h = task / nb, i0 = (task % nb) * R;
        float blk[S * R];  // blk[j R + l] = M[i0 + l][j]: lanes are rows
        const float *src = m_in + h * S * S;
        for (int64_t l = 0; l < R; l++)
            for (int64_t j = 0; j < S; j++) blk[j * R + l] = src[(i0 + l) * S + j];
        for (int64_t t = 0; t < T; t++) {
            const float *kr = k + (t * H + h) * S, *qr = q + (t * H + h) * S;
            const float gr = g[t * H + h], br = beta[t * H + h];
            float acc[R], d[R];
            for (int l = 0; l < R; l++) acc[l] = 0.0f;
            for (int64_t j = 0; j < S; j++)
                for (int l = 0; l < R; l++) acc[l] = acc[l] + (blk[j * R + l] * gr) * kr[j];
            for (int l = 0; l < R; l++) {
                d[l] = (v[(t * H + h) * S + i0 + l] - acc[l]) * br;
                acc[l] = 0.0f;
            }
            for (int64_t j = 0; j < S; j++)
                for (int l = 0; l < R; l++) {
                    const float r = blk[j * R + l] * gr + d[l] * kr[j];
                    blk[j * R + l] = r;
                    acc[l] = acc[l] + r * qr[j];
                }
            for (int l = 0; l < R; l++) o[(t * H + h) * S + i0 + l] = acc[l] * scale;
        }
        float *dst = m_out + h * S * S;
        for (int64_t l = 0; l < R; l++)
            for (int64_t j = 0; j < S; j++) dst[(i0 + l) * S + j] = blk[j * R + l];
    }
    return 0;
}

// Mamba-2: xbc [T, ldx] (x [H, P], B [G, N], C [G, N]), dt, da [T, H], s_in, s_out
// [H, P, N], y [T, H, P]. Rows p of a head's state are independent: blocks of RP rows (lanes)
// run through every token; y's sum over n follows ssm_scan.c's torch_sum for vl = 8 and
// N / 8 < 64 (small_sum_8): element n goes to accumulator (k, n % 8), k = (n / 8) % 4 while
// n / 8 < 4 (N / 32), else k = 0, each summed in ascending n from 0; then the four folded
// in order, the 8 lanes summed in order from 0, plus 0.
#ifndef RP
#define RP 32
#endif
int probe_ssd(int64_t T, int64_t H, int64_t P, int64_t N, int64_t G, const float *xbc,
              int64_t ldx,
              const float *dt, const float *da, const float *s_in, float *s_out, float *y,
              int nthreads) {
    if (P % RP || N % 8 || N / 8 >= 64 || G < 1 || H % G) return -3;
    const int64_t nb = P / RP, ilp4 = (N / 8) / 4 * 4;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int64_t task = 0; task < H * nb; task++) {
        const int64_t h = task / nb, p0 = (task % nb) * RP;
        float blk[N * RP];  // blk[n RP + l] = s[h][p0 + l][n]
        for (int64_t l = 0; l < RP; l++)
            for (int64_t n = 0; n < N; n++) blk[n * RP + l] = s_in[(h * P + p0 + l) * N + n];
        for (int64_t t = 0; t < T; t++) {
            const float d = dt[t * H + h], a = da[t * H + h];
            const float *x = xbc + t * ldx + h * P + p0;
            const float *b = xbc + t * ldx + H * P + (h / (H / G)) * N, *c = b + G * N;
            float xd[RP], acc[4][8][RP];
            memset(acc, 0, sizeof(acc));
            for (int l = 0; l < RP; l++) xd[l] = x[l] * d;
            for (int64_t n = 0; n < N; n++) {
                const int64_t e = n / 8;
                float *ac = acc[e < ilp4 ? e % 4 : 0][n % 8];
                for (int l = 0; l < RP; l++) {
                    const float decay = blk[n * RP + l] * a, inp = b[n] * xd[l];
                    const float sn = decay + inp;
                    blk[n * RP + l] = sn;
                    ac[l] += sn * c[n];
                }
            }
            for (int l = 0; l < RP; l++) {
                float fin = 0.0f;
                for (int m = 0; m < 8; m++) {
                    float a0 = acc[0][m][l];
                    for (int k = 1; k < 4; k++) a0 += acc[k][m][l];
                    fin += a0;
                }
                y[(t * H + h) * P + p0 + l] = 0.0f + fin;
            }
        }
        for (int64_t l = 0; l < RP; l++)
            for (int64_t n = 0; n < N; n++) s_out[(h * P + p0 + l) * N + n] = blk[n * RP + l];
    }
    return 0;
}
"""


def build(r: int = 64, rp: int = 32) -> ctypes.CDLL:
    """Compile the probe with the project's flags in a temporary directory and load it: r
    delta-net rows, rp Mamba-2 rows a block (the shapes then need S % r == P % rp == 0)."""
    from loraserve.cbuild_env import cflags

    tmp = Path(tempfile.mkdtemp(prefix="loraserve-probe-"))
    (tmp / "probe.c").write_text(SRC)
    subprocess.run(["gcc", *cflags(), f"-DR={r}", f"-DRP={rp}", str(tmp / "probe.c"), "-o",
                    str(tmp / "probe.so")], check=True)  # fmt: skip
    lib = ctypes.CDLL(str(tmp / "probe.so"))
    shutil.rmtree(tmp)  # loaded: the mapping outlives the file
    lib.probe_gdn.argtypes = ([ctypes.c_int64] * 3 + [ctypes.c_void_p] * 7
                              + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int])  # fmt: skip
    lib.probe_gdn.restype = ctypes.c_int
    lib.probe_ssd.argtypes = ([ctypes.c_int64] * 5 + [ctypes.c_void_p, ctypes.c_int64]
                              + [ctypes.c_void_p] * 5 + [ctypes.c_int])  # fmt: skip
    lib.probe_ssd.restype = ctypes.c_int
    return lib


def probe_ssd(lib: ctypes.CDLL, d: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The Mamba-2 probe on `chunked_scan.ssd_inputs` -> (y [T, H, P], final s)."""
    h, p, n, g = d["dims"]
    xbc = d["xbc"]
    t = xbc.shape[0]
    y, s = torch.empty(t, h, p), torch.empty(h, p, n)
    rc = lib.probe_ssd(t, h, p, n, g, xbc.data_ptr(), xbc.stride(0), d["dt"].data_ptr(),
                       d["da"].data_ptr(), d["s0"].data_ptr(), s.data_ptr(), y.data_ptr(),
                       torch.get_num_threads())  # fmt: skip
    if rc:
        raise ValueError(f"probe_ssd: {rc}")
    return y, s


def probe(lib: ctypes.CDLL, d: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe on `chunked_scan.gdn_inputs` -> (o [T, H, S], final M [H, S, S])."""
    t, h, s = d["q"].shape
    o, m = torch.empty(t, h, s), torch.empty(h, s, s)
    x = [d[n].contiguous() for n in ("m0", "q", "k", "v", "g", "beta")]
    rc = lib.probe_gdn(t, h, s, x[0].data_ptr(), m.data_ptr(), *(y.data_ptr() for y in x[1:]),
                       d["scale"], o.data_ptr(), torch.get_num_threads())  # fmt: skip
    if rc:
        raise ValueError(f"probe_gdn: {rc}")
    return o, m


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.chunked_recur_probe [--tokens N] [--reps N] [--threads N] [--wall]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.chunked_recur_probe",
                                 description=__doc__)  # fmt: skip
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lib, d = build(), gdn_inputs(args.tokens)
    (o0, m0), (o1, m1) = gdn_c(d), probe(lib, d)
    same = _bits(o0, o1) and _bits(m0, m1)
    clock = "wall" if args.wall else "thread-CPU"
    ds = ssd_inputs(args.tokens)
    (y0, s0), (y1, s1) = ssd_c(ds), probe_ssd(lib, ds)
    same_ssd = _bits(y0, y1) and _bits(s0, s1)
    for name, c_fn, p_fn, ok in (("delta-net", lambda: gdn_c(d), lambda: probe(lib, d), same),
                                 ("mamba-2", lambda: ssd_c(ds), lambda: probe_ssd(lib, ds),
                                  same_ssd)):  # fmt: skip
        ours = 1e3 * timed(c_fn, args.reps, args.wall)
        mine = 1e3 * timed(p_fn, args.reps, args.wall)
        print(f"{name}, {args.tokens} tokens, {args.threads} thread(s), {clock} ms (median of "
              f"{args.reps}): our C kernel {ours:.2f}, standalone probe {mine:.2f} "
              f"({ours / mine:.2f}x); same bits: {ok}")  # fmt: skip


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.reshape(-1).view(torch.int32), b.reshape(-1).view(torch.int32))


if __name__ == "__main__":
    main()
