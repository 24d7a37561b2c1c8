// The chunked (SSD) form of Mamba-2's selective scan (docs/chunked_scan.md, "Can a chunked
// form keep the numerics contract?"): chunks of C rows aligned to a sequence's absolute
// positions 0, C, 2C, ...; a sequence's record holds the state at its last chunk boundary
// plus the pending rows of the current chunk ("Carried"), so prompt rows and decode rows run
// the same code and every value is computed by one fixed sequence of float operations
// whatever the call's rows, the other sequences in it or the thread count.
//
// Record (float32, contiguous), for H heads, chunk C:
//   s [H][P][N]  state at the last chunk boundary       PX [H][C-1][P]  x_j dt_j, pending rows
//   PB [H][C-1][N]  B_j (the head's group's)            PG [H][C-1]  G_j = lg_0 + .. + lg_j
//   cnt [1]  pending rows 0..C-1 (as a float); slots j >= cnt are 0.0; all zeros = position 0.
// Row i at chunk position t of head h (s0 the boundary state, lg = dt A_h given per row):
//   X_t = x_i dt_i, B_t = B_i, G_t = lg_i (t = 0) or G_{t-1} + lg_i
//   y_i[p] = expf(G_t) dot(s0[p], C_i), then += (expf(G_t - G_j) dot(C_i, B_j)) X_j[p], j = 0..t
//   t = C-1: s0[p][n] <- expf(G_t) s0[p][n], then += (expf(G_t - G_j) X_j[p]) B_j[n], j = 0..C-1;
//            pending rows cleared.
// dot() is `ssd_dots` (ssd_dots.h): 16 fixed lanes (element k into lane k % 16, ascending),
// then a fixed halving fold. Every other loop runs over independent lanes (p or n), each
// value's operations in the order above, so no bit depends on the vector width (AVX2 and
// AVX-512 builds agree), the blocking, the call's rows or the thread count.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ssd_dots.h"

#ifdef _OPENMP
#include <omp.h>
#define SSD_THREAD() omp_get_thread_num()
#else
#define SSD_THREAD() 0
#endif

enum { SSD_MAX_C = 4096, SSD_CV = 4 };  // SSD_CV: vectors per row of a `ssd_close` block

// A call's sizes (ldx: xbc's row stride); ssd_s .. ssd_pg: where head h's parts of a record lie.
typedef struct {
    int64_t H, P, N, G, C, ldx;
} SsdDims;

static inline float *ssd_s(float *rec, const SsdDims *d, int64_t h) {
    return rec + h * d->P * d->N;
}
static inline float *ssd_px(float *rec, const SsdDims *d, int64_t h) {
    return rec + d->H * d->P * d->N + h * (d->C - 1) * d->P;
}
static inline float *ssd_pb(float *rec, const SsdDims *d, int64_t h) {
    return rec + d->H * (d->P * d->N + (d->C - 1) * d->P) + h * (d->C - 1) * d->N;
}
static inline float *ssd_pg(float *rec, const SsdDims *d, int64_t h) {
    return rec + d->H * (d->P * d->N + (d->C - 1) * (d->P + d->N)) + h * (d->C - 1);
}
static inline int64_t ssd_total(const SsdDims *d) {
    return d->H * (d->P * d->N + (d->C - 1) * (d->P + d->N + 1)) + 1;
}

// Head h's pending rows from slot `from` (X [C][P], B [C][N], Gs [C]; cnt of them) into
// record rec, and from slot 0 zeros past them (from > 0: rec holds the rows before it and
// zeros past them already); its state s [P][N] too unless s is already rec's.
static void ssd_put(float *rec, const SsdDims *d, int64_t h, const float *s, const float *X,
                    const float *B, const float *Gs, int64_t from, int64_t cnt) {
    const int64_t P = d->P, N = d->N, C1 = d->C - 1;
    float *rs = ssd_s(rec, d, h), *px = ssd_px(rec, d, h), *pb = ssd_pb(rec, d, h);
    float *pg = ssd_pg(rec, d, h);
    if (rs != s) memcpy(rs, s, (size_t)(P * N) * sizeof(float));
    memcpy(px + from * P, X + from * P, (size_t)((cnt - from) * P) * sizeof(float));
    memcpy(pb + from * N, B + from * N, (size_t)((cnt - from) * N) * sizeof(float));
    memcpy(pg + from, Gs + from, (size_t)(cnt - from) * sizeof(float));
    if (from > 0) return;
    memset(px + cnt * P, 0, (size_t)((C1 - cnt) * P) * sizeof(float));
    memset(pb + cnt * N, 0, (size_t)((C1 - cnt) * N) * sizeof(float));
    memset(pg + cnt, 0, (size_t)(C1 - cnt) * sizeof(float));
}

// Columns n0 .. n0 + SSD_W SSD_CV - 1 of rows p, p + 1 of the boundary update (`ssd_close`):
// 2 SSD_CV vectors through every j in registers.
static inline void ssd_close_block(float *s0, int64_t N, const float *wx, int64_t P,
                                   const float *B, int64_t C, float eg) {
    enum { V = SSD_CV };
    ssd_w acc[2][V];
    for (int q = 0; q < 2; q++)
        for (int v = 0; v < V; v++) acc[q][v] = eg * ssd_ld(s0 + q * N + SSD_W * v);
    for (int64_t j = 0; j < C; j++) {
        const float w0 = wx[j * P], w1 = wx[j * P + 1];
        for (int v = 0; v < V; v++) {
            const ssd_w b = ssd_ld(B + j * N + SSD_W * v);
            acc[0][v] += w0 * b;
            acc[1][v] += w1 * b;
        }
    }
    for (int q = 0; q < 2; q++)
        for (int v = 0; v < V; v++) memcpy(s0 + q * N + SSD_W * v, &acc[q][v], sizeof(ssd_w));
}

// The boundary update at a chunk's end: s [P][N] <- expf(G_last) s + sum_j (e_j X_j[p]) B_j[n]
// (e_j = expf(G_last - G_j), j ascending); wx [C][P] a work buffer. Blocks of two rows go
// through every j in registers (`ssd_close_block`); the edges take the same operations one
// value at a time.
static void ssd_close(float *s, const SsdDims *d, const float *X, const float *B,
                      const float *e, float eg, float *wx) {
    const int64_t P = d->P, N = d->N, C = d->C, nb = N / (SSD_W * SSD_CV) * (SSD_W * SSD_CV);
    for (int64_t j = 0; j < C; j++)
        for (int64_t p = 0; p < P; p++) wx[j * P + p] = e[j] * X[j * P + p];
    int64_t p = 0;
    for (; p + 2 <= P; p += 2)
        for (int64_t n0 = 0; n0 < nb; n0 += SSD_W * SSD_CV)
            ssd_close_block(s + p * N + n0, N, wx + p, P, B + n0, C, eg);
    for (int64_t q = 0; q < P; q++)
        for (int64_t n = q < p ? nb : 0; n < N; n++) {
            float v = eg * s[q * N + n];
            for (int64_t j = 0; j < C; j++) v += wx[j * P + q] * B[j * N + n];
            s[q * N + n] = v;
        }
}

// yo[p] = eg ys[p], then += w[j] X[j][p] for j = 0..k-1: SSD_CV vectors of p at a time in
// registers, the edge one value at a time.
static void ssd_y(float *yo, const float *ys, float eg, const float *w, const float *X,
                  int64_t k, int64_t P) {
    int64_t p = 0;
    for (; p + SSD_CV * SSD_W <= P; p += SSD_CV * SSD_W) {
        ssd_w acc[SSD_CV];
        for (int v = 0; v < SSD_CV; v++) acc[v] = eg * ssd_ld(ys + p + v * SSD_W);
        for (int64_t j = 0; j < k; j++)
            for (int v = 0; v < SSD_CV; v++) acc[v] += w[j] * ssd_ld(X + j * P + p + v * SSD_W);
        memcpy(yo + p, acc, sizeof(acc));
    }
    for (; p < P; p++) {
        float v = eg * ys[p];
        for (int64_t j = 0; j < k; j++) v += w[j] * X[j * P + p];
        yo[p] = v;
    }
}

// Per-thread work buffers of one (sequence, head) task.
typedef struct {
    float *X, *B, *Gs, *e, *w, *wx, *ys;
} SsdWork;

// Sequence z's rows for head h. s: the head's state in rec_out (holding the boundary state);
// X, B, Gs, cnt: its pending rows (from rec_in, already copied).
static void ssd_head(const SsdDims *d, int64_t h, float *s, int64_t cnt, SsdWork *wk,
                     const float *xbc, const float *dt, const float *lg, float *y, int64_t lo,
                     int64_t n, const int64_t *snaps, int64_t nsnap, void *const *snap_ptrs) {
    const int64_t H = d->H, P = d->P, N = d->N, C = d->C, rep = H / d->G;
    const int64_t boff = H * P + (h / rep) * N, coff = boff + d->G * N;
    float *X = wk->X, *B = wk->B, *Gs = wk->Gs, *e = wk->e, *w = wk->w, *ys = wk->ys;
    int64_t next = 0, r = 0;
    while (r < n) {  // a segment: rows r .. r1-1 of one chunk, whose boundary state is s
        const int64_t r1 = r + (C - cnt) < n ? r + (C - cnt) : n, k = r1 - r;
        for (int64_t i = 0; i < k; i++) {  // its rows into pending slots cnt .. cnt + k - 1
            const int64_t row = lo + r + i, t = cnt + i;
            const float *xr = xbc + row * d->ldx;
            const float dd = dt[row * H + h], l = lg[row * H + h];
            for (int64_t p = 0; p < P; p++) X[t * P + p] = xr[h * P + p] * dd;
            memcpy(B + t * N, xr + boff, (size_t)N * sizeof(float));
            Gs[t] = t == 0 ? l : Gs[t - 1] + l;
        }
        for (int64_t i = k; i < k + C && r + i < n; i++) {  // the next segment's x, B, C
            const float *xr = xbc + (lo + r + i) * d->ldx;
            for (int64_t q = 0; q < P; q += 16) __builtin_prefetch(xr + h * P + q);
            for (int64_t q = 0; q < N; q += 16) {
                __builtin_prefetch(xr + boff + q);
                __builtin_prefetch(xr + coff + q);
            }
        }
        for (int64_t p0 = 0; p0 < P; p0 += 16) {  // ys[i][p] = dot(C_i, s0[p]), 4 rows at once
            const int64_t np = P - p0 < 16 ? P - p0 : 16;
            const size_t bytes = (size_t)np * sizeof(float);
            float o[4 * 16];
            for (int64_t i = 0; i < k; i += 4) {
                const float *cs[4];
                const int rows = k - i < 4 ? (int)(k - i) : 4;
                for (int q = 0; q < rows; q++) cs[q] = xbc + (lo + r + i + q) * d->ldx + coff;
                const float *s0 = s + p0 * N;
                if (rows == 4) ssd_dots(cs, 4, s0, N, np, N, o);
                else
                    for (int q = 0; q < rows; q++) ssd_dots(cs + q, 1, s0, N, np, N, o + q * 16);
                for (int q = 0; q < rows; q++) memcpy(ys + (i + q) * P + p0, o + q * 16, bytes);
            }
        }
        for (int64_t i = 0; i < k; i++, r++) {
            const int64_t row = lo + r, t = cnt;
            const float *c = xbc + row * d->ldx + coff;
            const float eg = expf(Gs[t]);
            for (int64_t j0 = 0; j0 <= t; j0 += 16) {  // w_j = e_j dot(C_i, B_j)
                float o[16];
                ssd_dots(&c, 1, B + j0 * N, N, t + 1 - j0 < 16 ? t + 1 - j0 : 16, N, o);
                for (int64_t j = j0; j <= t && j < j0 + 16; j++) {
                    e[j] = expf(Gs[t] - Gs[j]);
                    w[j] = e[j] * o[j - j0];
                }
            }
            ssd_y(y + (row * H + h) * P, ys + i * P, eg, w, X, t + 1, P);
            cnt = t + 1;
            if (cnt == C) {
                ssd_close(s, d, X, B, e, eg, wk->wx);
                cnt = 0;
            }
            if (next < nsnap && snaps[next] == r)
                ssd_put(snap_ptrs[next++], d, h, s, X, B, Gs, 0, cnt);
        }
    }
}

// The chunked scan of nseq sequences (see the top of this file): xbc rows [T][>= H P + 2 G N]
// (x [H][P], B [G][N], C [G][N]) of stride ldx; dt, lg [T][H]; y [T][H][P] written. Sequence z
// owns rows lo[z] .. lo[z] + n[z] - 1, reads its record rec_in[z] and writes rec_out[z] (the
// same memory or disjoint); after its local rows snap_rows[snap_off[z] .. snap_off[z+1]-1]
// (ascending) the whole record is also written to snap_ptrs[...]. Tasks: (sequence, head).
// Returns 0, or before writing anything: -2 out of memory, -3 sizes that do not fit, -4 a
// record whose cnt is not an integer in 0..C-1.
int ls_ssd_chunk(int64_t nseq, const int64_t *lo, const int64_t *n, void **rec_in,
                 void **rec_out, const float *xbc, int64_t xbc_stride, const float *dt,
                 const float *lg, float *y, int64_t H, int64_t P, int64_t N, int64_t G,
                 int64_t C, const int64_t *snap_off, const int64_t *snap_rows,
                 void **snap_ptrs, int nthreads) {
    const SsdDims d = {H, P, N, G, C, xbc_stride};
    if (nseq < 0 || H < 1 || P < 1 || N < 1 || G < 1 || H % G != 0 || C < 1 ||
        C > SSD_MAX_C || xbc_stride < H * P + 2 * G * N)
        return -3;
    if (nseq == 0) return 0;
    if (!lo || !n || !rec_in || !rec_out || !snap_off || snap_off[0] < 0) return -3;
    if (snap_off[nseq] > 0 && (!snap_rows || !snap_ptrs)) return -3;
    const int64_t total = ssd_total(&d);
    int64_t work = 0;
    for (int64_t z = 0; z < nseq; z++) {
        if (lo[z] < 0 || n[z] < 0 || snap_off[z + 1] < snap_off[z] || !rec_in[z] || !rec_out[z])
            return -3;
        for (int64_t e = snap_off[z]; e < snap_off[z + 1]; e++)
            if (snap_rows[e] < 0 || snap_rows[e] >= n[z] || !snap_ptrs[e] ||
                (e > snap_off[z] && snap_rows[e] <= snap_rows[e - 1]))
                return -3;
        const float cf = ((const float *)rec_in[z])[total - 1];
        if (!(cf >= 0.0f && cf <= (float)(C - 1)) || cf != (float)(int64_t)cf) return -4;
        work += n[z];
    }
    if (work > 0 && (!xbc || !dt || !lg || !y)) return -3;
    int64_t *cnt0 = malloc((size_t)nseq * sizeof(int64_t));
    if (!cnt0) return -2;
    for (int64_t z = 0; z < nseq; z++) cnt0[z] = (int64_t)((const float *)rec_in[z])[total - 1];
    if (nthreads < 1 || work * H * P * N < 65536) nthreads = 1;
    const size_t fl = (size_t)(C * (3 * P + N + 3));  // per thread, all taken before any write
    float *bufs = malloc((size_t)nthreads * fl * sizeof(float));
    if (!bufs) {
        free(cnt0);
        return -2;
    }
#pragma omp parallel num_threads(nthreads)
    {
        float *buf = bufs + (size_t)SSD_THREAD() * fl;
        SsdWork wk = {buf, buf + C * P, buf + C * (P + N), buf + C * (P + N + 1),
                      buf + C * (P + N + 2), buf + C * (P + N + 3), buf + C * (2 * P + N + 3)};
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < nseq * H; task++) {
            const int64_t z = task / H, h = task % H, cnt = cnt0[z];
            float *in = rec_in[z], *out = rec_out[z], *s = ssd_s(out, &d, h);
            memcpy(wk.X, ssd_px(in, &d, h), (size_t)(cnt * P) * sizeof(float));
            memcpy(wk.B, ssd_pb(in, &d, h), (size_t)(cnt * N) * sizeof(float));
            memcpy(wk.Gs, ssd_pg(in, &d, h), (size_t)cnt * sizeof(float));
            if (in != out) memcpy(s, ssd_s(in, &d, h), (size_t)(P * N) * sizeof(float));
            ssd_head(&d, h, s, cnt, &wk, xbc, dt, lg, y, lo[z], n[z], snap_rows + snap_off[z],
                     snap_off[z + 1] - snap_off[z], snap_ptrs + snap_off[z]);
            const int64_t kept = in == out && cnt + n[z] < C ? cnt : 0;  // in place, no chunk end
            ssd_put(out, &d, h, s, wk.X, wk.B, wk.Gs, kept, (cnt + n[z]) % C);
        }
    }
    for (int64_t z = 0; z < nseq; z++) {
        ((float *)rec_out[z])[total - 1] = (float)((cnt0[z] + n[z]) % C);
        for (int64_t e = snap_off[z]; e < snap_off[z + 1]; e++)
            ((float *)snap_ptrs[e])[total - 1] = (float)((cnt0[z] + snap_rows[e] + 1) % C);
    }
    free(bufs);
    free(cnt0);
    return 0;
}
