// The selective-scan recurrences of Mamba-2 and Mamba-1 in one call per layer per step:
// (sequence, head) or (sequence, channel) pairs in parallel, each sequence's tokens in their
// fixed order. Every float operation is the one the torch reference (recurrent/mamba2.py,
// mamba1.py) does, in its order: the state update s * dA + B (x dt) as separate products
// and sum (the library builds with -ffp-contract=off), and y = sum_n s C summed in the exact
// order of torch's float sum over a contiguous last dim (`torch_sum`), so the results are
// bit-identical to the torch loop. dt (softplus) and dA (exp) come precomputed from torch.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "row_block.h"

// torch's cascade row sum (aten SumKernel.cpp `row_sum`/`multi_row_sum`) over `size`
// elements of w lanes each (element e at v + e * w): 4 interleaved accumulators of 4 levels,
// each level folded into the next every 16 elements. out: w lanes.
static void row_sum_w(const float *v, int64_t size, int w, float *out) {
    float acc[4][4][16];
    memset(acc, 0, sizeof(acc));
    const int64_t size_ilp = size / 4, lp = 4, step = 1 << 4, mask = step - 1;
    int64_t i = 0;
    while (i + step <= size_ilp) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < w; l++) acc[0][k][l] += v[(i * 4 + k) * w + l];
        for (int j = 1; j < 4; j++) {
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < w; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * lp))) != 0) break;
        }
    }
    for (; i < size_ilp; i++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += v[(i * 4 + k) * w + l];
    for (int j = 1; j < 4; j++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += acc[j][k][l];
    for (int64_t e = size_ilp * 4; e < size; e++)
        for (int l = 0; l < w; l++) acc[0][0][l] += v[e * w + l];
    for (int k = 1; k < 4; k++)
        for (int l = 0; l < w; l++) acc[0][0][l] += acc[0][k][l];
    for (int l = 0; l < w; l++) out[l] = acc[0][0][l];
}

// row_sum_w for fewer than 64 elements (the levels never fold: their adds of +0.0 leave a
// sum unchanged, as a sum starting from +0.0 is never -0.0), W a constant so the lane loops
// become vector adds
#define SMALL_SUM(W)                                                                      \
    static inline void small_sum_##W(const float *v, int64_t size, float *out) {          \
        float acc[4][W] = {{0.0f}};                                                        \
        const int64_t size_ilp = size / 4;                                                 \
        for (int64_t i = 0; i < size_ilp; i++)                                             \
            for (int k = 0; k < 4; k++)                                                    \
                for (int l = 0; l < W; l++) acc[k][l] += v[(i * 4 + k) * W + l];          \
        for (int64_t e = size_ilp * 4; e < size; e++)                                      \
            for (int l = 0; l < W; l++) acc[0][l] += v[e * W + l];                         \
        for (int k = 1; k < 4; k++)                                                        \
            for (int l = 0; l < W; l++) acc[0][l] += acc[k][l];                            \
        for (int l = 0; l < W; l++) out[l] = acc[0][l];                                    \
    }
SMALL_SUM(1)
SMALL_SUM(8)
SMALL_SUM(16)

static inline void lane_sum(const float *v, int64_t size, int w, float *out) {
    if (size < 64 && w == 8) small_sum_8(v, size, out);
    else if (size < 64 && w == 16) small_sum_16(v, size, out);
    else if (size < 64 && w == 1) small_sum_1(v, size, out);
    else row_sum_w(v, size, w, out);
}

// torch.sum(v[:n]) for float32 as torch computes it with vectors of vl floats (8 on this
// machine's torch, found by the wrapper's probe): a row of at least vl values sums whole
// vectors lane-wise, then the scalar tail in order, then the lanes in order; a shorter row
// sums its scalars.
static float torch_sum(const float *v, int64_t n, int vl) {
    float lanes[16];
    if (n >= vl) {
        const int64_t nv = n / vl;
        lane_sum(v, nv, vl, lanes);
        float fin = 0.0f;
        for (int64_t k = nv * vl; k < n; k++) fin += v[k];
        for (int l = 0; l < vl; l++) fin += lanes[l];
        return 0.0f + fin;  // torch adds into a zero-filled output
    }
    lane_sum(v, n, 1, lanes);
    return 0.0f + lanes[0];
}

// The largest state width the scans take: `prod` is a stack array of N floats per task.
#define SSM_MAX_N 4096

// Whether sequences q = 0..nseq-1 own rows lo[q] <= .. < hi[q] (from row 0) and their snapshot
// rows snap_rows[snap_off[q] .. snap_off[q+1]-1] ascend inside them; vl a lane count the sums
// take (1..16): what the scans check before touching memory (issue 31: every C entry point
// checks its sizes rather than trusting its caller).
static int spans_fit(int64_t nseq, const int64_t *lo, const int64_t *hi,
                     const int64_t *snap_rows, const int64_t *snap_off, int vl) {
    if (nseq < 0 || vl < 1 || vl > 16) return 0;
    if (nseq == 0) return 1;
    if (!lo || !hi || !snap_off || snap_off[0] < 0) return 0;
    for (int64_t q = 0; q < nseq; q++) {
        if (lo[q] < 0 || hi[q] < lo[q] || snap_off[q + 1] < snap_off[q]) return 0;
        for (int64_t e = snap_off[q]; e < snap_off[q + 1]; e++)
            if (snap_rows[e] < lo[q] || snap_rows[e] >= hi[q] ||
                (e > snap_off[q] && snap_rows[e] <= snap_rows[e - 1]))
                return 0;
    }
    return 1;
}

// A prompt's rows run by blocks of SSM_ROWS state rows p of a head (issue 28,
// docs/chunked_scan.md): each row of s [P, N] evolves alone, so a block (16 KiB at N = 128: L1)
// runs through every token before the next one. The block is held transposed (blk[n nr + l] =
// s[p0 + l][n]: the lanes are rows) and y's sum over n keeps torch_sum's order for each row:
// its short form (fewer than 64 vectors of w lanes, as small_sum: vector e into accumulator
// e % 4, the last nv % 4 into 0; then 0 += 1, += 2, += 3; the scalar tail from 0.0f, then the
// lanes in order, then 0.0f +). Wider sums (64 vectors or more) and sequences of fewer than
// SSM_BLOCK_MIN rows keep the per-token loop. The same float operations per value: the same bits.
enum { SSM_ROWS = 32, SSM_BLOCK_MIN = 16, SSM_LANES = 16 };

// One token through the block blk [N][nr] (nr <= SSM_ROWS): x, y at the block's first row,
// b, c [N] the token's group rows, d its dt, a its dA; sums of w lanes (1 when N < vl).
// Inlined with nr a constant where it is one.
static inline __attribute__((always_inline)) void block_token(
    float *restrict blk, int64_t nr, const float *x, const float *b, const float *c, float d,
    float a, int64_t N, int64_t w, float *y) {
    float xd[SSM_ROWS], tail[SSM_ROWS], acc[4][SSM_LANES][SSM_ROWS];
    const int64_t nv = N / w, full = nv / 4 * 4;
    for (int64_t l = 0; l < nr; l++) {
        xd[l] = x[l] * d;
        tail[l] = 0.0f;
    }
    for (int k = 0; k < 4; k++)
        for (int64_t m = 0; m < w; m++)
            for (int64_t l = 0; l < nr; l++) acc[k][m][l] = 0.0f;
    for (int64_t e = 0; e < nv; e++) {
        const int k = e < full ? (int)(e & 3) : 0;
        for (int64_t m = 0; m < w; m++) {
            const int64_t n = e * w + m;
            const float bn = b[n], cn = c[n];  // in registers: blk's stores may alias b, c
            float *sn = blk + n * nr, *ac = acc[k][m];
            for (int64_t l = 0; l < nr; l++) {
                const float decay = sn[l] * a, inp = bn * xd[l];
                sn[l] = decay + inp;
                ac[l] = ac[l] + sn[l] * cn;
            }
        }
    }
    for (int64_t n = nv * w; n < N; n++) {
        const float bn = b[n], cn = c[n];
        float *sn = blk + n * nr;
        for (int64_t l = 0; l < nr; l++) {
            const float decay = sn[l] * a, inp = bn * xd[l];
            sn[l] = decay + inp;
            tail[l] = tail[l] + sn[l] * cn;
        }
    }
    for (int64_t m = 0; m < w; m++) {  // per row: fin = tail + lane 0 + .. + lane w - 1
        for (int k = 1; k < 4; k++)
            for (int64_t l = 0; l < nr; l++) acc[0][m][l] += acc[k][m][l];
        for (int64_t l = 0; l < nr; l++) tail[l] += acc[0][m][l];
    }
    for (int64_t l = 0; l < nr; l++) y[l] = 0.0f + tail[l];
}

// Mamba-2. xbc [T, ldx]: x [H, P] at 0, B [G, N] at H P, C [G, N] at H P + G N of each row;
// dt, da [T, H]; sequences q = 0..nseq-1 own rows lo[q]..hi[q]-1 and their state
// s[q] [H, P, N] (updated in place, starting from s_in[q] where given); rows
// snap_rows[snap_off[q]..snap_off[q+1]-1] (ascending) copy the state after that row into snaps
// [n_snaps, H P N]; y [T, H, P]. Tasks: (sequence, head, block of SSM_ROWS state rows).
// Returns 0, -2 when a work buffer could not be allocated (outputs then undefined), or -3 for
// sizes that do not fit (a head count G does not divide, ldx < H P + 2 G N, a span or
// snapshot row out of order, N past SSM_MAX_N).
int ls_ssm_scan2(const float *xbc, int64_t ldx, const float *dt, const float *da, int64_t H,
                 int64_t P, int64_t N, int64_t G, int64_t nseq, const int64_t *lo,
                 const int64_t *hi, float *s, const float *const *s_in,
                 const int64_t *snap_rows, const int64_t *snap_off, float *snaps, float *y,
                 int vl, int nthreads) {
    if (H < 1 || P < 1 || N < 1 || N > SSM_MAX_N || G < 1 || H % G != 0 ||
        ldx < H * P + 2 * G * N || !spans_fit(nseq, lo, hi, snap_rows, snap_off, vl))
        return -3;
    const int64_t HPN = H * P * N, rep = H / G, nb = (P + SSM_ROWS - 1) / SSM_ROWS;
    const int64_t w = N < vl ? 1 : vl, blocks = N / w < 64;  // torch_sum's short form
    if (nseq * HPN < 4096) nthreads = 1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float *blk = blocks ? malloc((size_t)(N * SSM_ROWS) * sizeof(float)) : NULL;
        if (blocks && blk == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < nseq * H * nb; task++) {
            const int64_t q = task / (H * nb), h = task / nb % H, p0 = task % nb * SSM_ROWS;
            const int64_t nr = P - p0 < SSM_ROWS ? P - p0 : SSM_ROWS;
            float *sh = s + q * HPN + h * P * N;
            const float *from = s_in ? s_in[q] + h * P * N : sh;  // NULL: s holds them already
            int64_t next = snap_off[q];
            if (!blocks || hi[q] - lo[q] < SSM_BLOCK_MIN) {  // token by token, the whole head
                if (p0 > 0) continue;
                if (s_in) memcpy(sh, from, (size_t)(P * N) * sizeof(float));
                float prod[N > 0 ? N : 1];
                for (int64_t row = lo[q]; row < hi[q]; row++) {
                    const float d = dt[row * H + h], a = da[row * H + h];
                    const float *x = xbc + row * ldx + h * P;
                    const float *b = xbc + row * ldx + H * P + (h / rep) * N;
                    const float *c = b + G * N;
                    for (int64_t p = 0; p < P; p++) {
                        const float xd = x[p] * d;
                        float *sp = sh + p * N;
                        for (int64_t n = 0; n < N; n++) {
                            const float decay = sp[n] * a, inp = b[n] * xd;
                            sp[n] = decay + inp;
                            prod[n] = sp[n] * c[n];
                        }
                        y[(row * H + h) * P + p] = torch_sum(prod, N, vl);
                    }
                    if (next < snap_off[q + 1] && snap_rows[next] == row) {
                        memcpy(snaps + next * HPN + h * P * N, sh, (size_t)(P * N) * sizeof(float));
                        next++;
                    }
                }
                continue;
            }
            if (blk == NULL) continue;
            row_block_in(from + p0 * N, blk, nr, N);
            for (int64_t row = lo[q]; row < hi[q]; row++) {
                const float d = dt[row * H + h], a = da[row * H + h];
                const float *x = xbc + row * ldx + h * P + p0;
                const float *b = xbc + row * ldx + H * P + (h / rep) * N;
                float *yr = y + (row * H + h) * P + p0;
                if (nr == SSM_ROWS) block_token(blk, SSM_ROWS, x, b, b + G * N, d, a, N, w, yr);
                else block_token(blk, nr, x, b, b + G * N, d, a, N, w, yr);
                if (next < snap_off[q + 1] && snap_rows[next] == row) {
                    row_block_out(blk, snaps + next * HPN + h * P * N + p0 * N, nr, N);
                    next++;
                }
            }
            row_block_out(blk, sh + p0 * N, nr, N);
        }
        free(blk);
    }
    return failed ? -2 : 0;
}

// Mamba-1. x, dt [T, D] (dt after softplus); da [rows r0..r1-1 of T, D, N] (exp(dt A));
// b, c [T, N]; rows r0..r1-1 only (a block of the step: da is built a block at a time), each
// sequence's rows lo[q]..hi[q]-1 within it, its state s[q] [D, N] updated in place; snapshots
// as ls_ssm_scan2 (state [D N]); y [T, D]. Returns 0, or -3 for sizes that do not fit.
int ls_ssm_scan1(const float *x, const float *dt, const float *da, const float *b,
                 const float *c, int64_t D, int64_t N, int64_t nseq, const int64_t *lo,
                 const int64_t *hi, int64_t r0, int64_t r1, float *s,
                 const int64_t *snap_rows, const int64_t *snap_off, float *snaps, float *y,
                 int vl, int nthreads) {
    if (D < 1 || N < 1 || N > SSM_MAX_N || r0 < 0 || r1 < r0 ||
        !spans_fit(nseq, lo, hi, snap_rows, snap_off, vl))
        return -3;
    const int64_t DN = D * N, CH = 64;  // channels per task
    const int64_t nch = (D + CH - 1) / CH;
    if (nseq * DN < 4096) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int64_t qd = 0; qd < nseq * nch; qd++) {
        const int64_t q = qd / nch, d0 = (qd % nch) * CH, d1 = d0 + CH < D ? d0 + CH : D;
        const int64_t lo_q = lo[q] > r0 ? lo[q] : r0, hi_q = hi[q] < r1 ? hi[q] : r1;
        float prod[N > 0 ? N : 1];
        int64_t next = snap_off[q];
        while (next < snap_off[q + 1] && snap_rows[next] < lo_q) next++;
        for (int64_t row = lo_q; row < hi_q; row++) {
            const float *br = b + row * N, *cr = c + row * N;
            for (int64_t d = d0; d < d1; d++) {
                const float xd = x[row * D + d] * dt[row * D + d];
                const float *ar = da + ((row - r0) * D + d) * N;
                float *sp = s + q * DN + d * N;
                for (int64_t n = 0; n < N; n++) {
                    const float decay = sp[n] * ar[n], inp = br[n] * xd;
                    sp[n] = decay + inp;
                    prod[n] = sp[n] * cr[n];
                }
                y[row * D + d] = torch_sum(prod, N, vl);
            }
            if (next < snap_off[q + 1] && snap_rows[next] == row) {
                memcpy(snaps + next * DN + d0 * N, s + q * DN + d0 * N,
                       (size_t)((d1 - d0) * N) * sizeof(float));
                next++;
            }
        }
    }
    return 0;
}

// out[r] = torch_sum(v[r, :n]) for rows r = 0..rows-1 of v [rows, n]: the wrapper checks
// which vector width makes these torch's own sums before running a scan. Returns 0, or -3
// for sizes that do not fit (vl outside 1..16: the lanes are a stack array of 16).
int ls_ssm_rowsum(const float *v, int64_t rows, int64_t n, int vl, float *out) {
    if (rows < 0 || n < 0 || vl < 1 || vl > 16) return -3;
    for (int64_t r = 0; r < rows; r++) out[r] = torch_sum(v + r * n, n, vl);
    return 0;
}
