// The gated delta rule's per-token recurrence (`model/recurrent/deltanet.py`) in one call per
// layer and step: every (sequence, value head) pair in parallel, each sequence's tokens in
// order. Per token t and value head h, with M [S (value), S (key)] the head's state:
//
//     M <- M * g;  d = (v - M k) * beta;  M <- M + d k^T;  o = (M q) * scale
//
// with exactly the float operations of the torch reference, in its order: every product is
// rounded before it is added (-ffp-contract=off), and each of M k and M q sums over the key
// index from 0 upwards starting at 0 (what torch's bmm does for more than one head).
//
// Two forms, the same bits: with AVX2 and S a multiple of 8 (every real model: S = 64, 128,
// 256), M stays in its row-major layout and each 8x8 tile is transposed in registers, so the
// 8 rows i of a tile are the lanes of one vector and each lane sums over j in order; a token
// reads the state twice and writes it once (M g is computed in both passes, the same bits,
// instead of being stored), and a decode step reads m_in and writes m_out directly. Else the
// head's M is held transposed (MT[j][i] = M[i][j]) in a work buffer while it runs, so the loops
// over the value index i are independent lanes the compiler vectorizes without reordering.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "row_block.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static void transpose(const float *a, float *b, int64_t s) {  // b[j][i] = a[i][j]
    enum { TILE = 16 };  // tiles: a's rows and b's rows both stay in a few cache lines
    for (int64_t i0 = 0; i0 < s; i0 += TILE)
        for (int64_t j0 = 0; j0 < s; j0 += TILE) {
            const int64_t i1 = i0 + TILE < s ? i0 + TILE : s, j1 = j0 + TILE < s ? j0 + TILE : s;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1; j++) b[j * s + i] = a[i * s + j];
        }
}


// One token of one head on the transposed state mt (MT[j][i] = M[i][j]), in place: the
// generic form (any S); acc, d [S] scratch.
static void token_t(float *mt, const float *kr, const float *qr, const float *vr, float gr,
                    float br, float scale, float *orow, float *acc, float *d, int64_t S) {
    for (int64_t i = 0; i < S; i++) acc[i] = 0.0f;
    for (int64_t j = 0; j < S; j++) {  // M <- M g; acc = M k
        float *c = mt + j * S;
        const float kj = kr[j];
        for (int64_t i = 0; i < S; i++) {
            c[i] = c[i] * gr;
            acc[i] = acc[i] + c[i] * kj;
        }
    }
    for (int64_t i = 0; i < S; i++) {
        d[i] = (vr[i] - acc[i]) * br;
        acc[i] = 0.0f;
    }
    for (int64_t j = 0; j < S; j++) {  // M <- M + d k^T; acc = M q
        float *c = mt + j * S;
        const float kj = kr[j], qj = qr[j];
        for (int64_t i = 0; i < S; i++) {
            c[i] = c[i] + d[i] * kj;
            acc[i] = acc[i] + c[i] * qj;
        }
    }
    for (int64_t i = 0; i < S; i++) orow[i] = acc[i] * scale;
}

#if defined(__AVX2__)
// r[0..7] (rows) -> their transpose in place: r[j] lane i = old r[i] lane j
static inline void tr8(__m256 *r) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// One token of one head on row-major states (S % 8 == 0): src [S, S] -> dst [S, S] (may be
// src), o[i] = (M q)[i] * scale; d [S] is scratch.
static void token_tiles(const float *src, float *dst, const float *kr, const float *qr,
                        const float *vr, float gr, float br, float scale, float *orow,
                        float *d, int64_t S) {
    const __m256 g = _mm256_set1_ps(gr), b = _mm256_set1_ps(br);
    for (int64_t i0 = 0; i0 < S; i0 += 8) {  // d = (v - (M g) k) beta, rows i0 .. i0 + 7
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j0 = 0; j0 < S; j0 += 8) {
            __m256 r[8];
            for (int a = 0; a < 8; a++) r[a] = _mm256_mul_ps(_mm256_loadu_ps(src + (i0 + a) * S + j0), g);
            tr8(r);
            for (int a = 0; a < 8; a++)
                acc = _mm256_add_ps(acc, _mm256_mul_ps(r[a], _mm256_set1_ps(kr[j0 + a])));
        }
        _mm256_storeu_ps(d + i0, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(vr + i0), acc), b));
    }
    const __m256 sc = _mm256_set1_ps(scale);
    for (int64_t i0 = 0; i0 < S; i0 += 8) {  // M <- M g + d k^T; o = M q
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j0 = 0; j0 < S; j0 += 8) {
            const __m256 kv = _mm256_loadu_ps(kr + j0);
            __m256 r[8];
            for (int a = 0; a < 8; a++) {
                const __m256 mg = _mm256_mul_ps(_mm256_loadu_ps(src + (i0 + a) * S + j0), g);
                r[a] = _mm256_add_ps(mg, _mm256_mul_ps(_mm256_set1_ps(d[i0 + a]), kv));
                _mm256_storeu_ps(dst + (i0 + a) * S + j0, r[a]);
            }
            tr8(r);
            for (int a = 0; a < 8; a++)
                acc = _mm256_add_ps(acc, _mm256_mul_ps(r[a], _mm256_set1_ps(qr[j0 + a])));
        }
        _mm256_storeu_ps(orow + i0, _mm256_mul_ps(acc, sc));
    }
}
#endif

// One token of one head, whole state: src [S, S] -> dst [S, S] (may be src); work [S S + 2 S]
// scratch. The register tiles where they apply, else the transposed form: the same bits.
// Every per-token path runs this (a decode step, a prompt's few rows).
static inline void head_token(const float *src, float *dst, const float *kr, const float *qr,
                              const float *vr, float gr, float br, float scale, float *orow,
                              float *work, int64_t S) {
#if defined(__AVX2__)
    if (S % 8 == 0) {
        token_tiles(src, dst, kr, qr, vr, gr, br, scale, orow, work + S * S + S, S);
        return;
    }
#endif
    transpose(src, work, S);
    token_t(work, kr, qr, vr, gr, br, scale, orow, work + S * S, work + S * S + S, S);
    transpose(work, dst, S);
}

// A prompt's rows run by blocks of state rows (issue 28, docs/chunked_scan.md): row i of M
// evolves alone (m_i <- g m_i + d_i k^T, d_i = beta (v_i - g m_i.k), o_i = scale m_i.q), so a
// block of GDN_ROWS rows (32 KiB at S = 128: L1) runs through every token before the next
// block, instead of each token sweeping the whole state (64 KiB, L2, twice). Per row the float
// operations of token_t / token_tiles in their order: the same bits. Sequences of fewer than
// GDN_BLOCK_MIN rows (decode steps, drafts) stay token by token on the register tiles.
enum { GDN_ROWS = 64, GDN_BLOCK_MIN = 8 };

typedef struct {  // one ls_gdn_recur call's token rows
    const float *q, *k, *v, *g, *beta;
    float *o;
    int64_t v_ld, H, S;
    float scale;
} gdn_io_t;

// Rows i0 .. i0 + nr - 1 (nr <= GDN_ROWS) of head h, transposed in blk (lanes = rows), through
// rows lo .. lo + n - 1; the state after local row snap_row[e] (e in e0 .. e1 - 1) goes to those
// rows of snap_dst[e]. Inlined with nr a constant where it is one (the lanes in registers).
static inline __attribute__((always_inline)) void block_run(
    const gdn_io_t *io, float *restrict blk, int64_t nr, int64_t h, int64_t i0, int64_t lo,
    int64_t n, const int64_t *snap_row, float *const *snap_dst, int64_t e, int64_t e1) {
    const int64_t H = io->H, S = io->S;
    for (int64_t r = 0; r < n; r++) {
        const int64_t th = (lo + r) * H + h;
        const float *kr = io->k + th * S, *qr = io->q + th * S;
        const float *vr = io->v + (lo + r) * io->v_ld + h * S + i0;
        const float gr = io->g[th], br = io->beta[th];
        float acc[GDN_ROWS], d[GDN_ROWS];
        for (int64_t l = 0; l < nr; l++) acc[l] = 0.0f;
        for (int64_t j = 0; j < S; j++) {  // acc = (M g) k
            const float *c = blk + j * nr;
            const float kj = kr[j];
            for (int64_t l = 0; l < nr; l++) acc[l] = acc[l] + (c[l] * gr) * kj;
        }
        for (int64_t l = 0; l < nr; l++) {
            d[l] = (vr[l] - acc[l]) * br;
            acc[l] = 0.0f;
        }
        for (int64_t j = 0; j < S; j++) {  // M <- M g + d k^T; acc = M q
            float *c = blk + j * nr;
            const float kj = kr[j], qj = qr[j];
            for (int64_t l = 0; l < nr; l++) {
                const float m = c[l] * gr + d[l] * kj;
                c[l] = m;
                acc[l] = acc[l] + m * qj;
            }
        }
        float *orow = io->o + th * S + i0;
        for (int64_t l = 0; l < nr; l++) orow[l] = acc[l] * io->scale;
        for (; e < e1 && snap_row[e] == r; e++)
            row_block_out(blk, snap_dst[e] + h * S * S + i0 * S, nr, S);
    }
}

// n_seq sequences; sequence z owns rows lo[z] .. lo[z] + n[z] - 1 of q, k [T, H, S]
// (contiguous), v (row stride v_ld, heads contiguous), g and beta [T, H], o [T, H, S]. Its
// state M [H, S, S] is read from m_in[z] and the state after its last row written to m_out[z]
// (m_in is never written). Snapshots: for e in snap_off[z] .. snap_off[z+1] - 1, the state
// after its row snap_row[e] (counted from lo[z], ascending) goes to snap_dst[e] [H, S, S].
// Tasks: (sequence, head, block of GDN_ROWS state rows). Returns 0, -1 when a work buffer
// could not be allocated (outputs then undefined), or -3 for sizes that do not fit (a span or
// snapshot row outside its sequence, v_ld < H S).
int ls_gdn_recur(int64_t n_seq, const int64_t *lo, const int64_t *n, const float *const *m_in,
                 float *const *m_out, const float *q, const float *k, const float *v,
                 int64_t v_ld, const float *g, const float *beta, float scale, float *o,
                 int64_t H, int64_t S, const int64_t *snap_off, const int64_t *snap_row,
                 float *const *snap_dst, int nthreads) {
    if (n_seq < 0 || H < 1 || S < 1 || v_ld < H * S || (n_seq > 0 && snap_off[0] < 0))
        return -3;
    for (int64_t z = 0; z < n_seq; z++) {  // spans and snapshot rows inside their sequence
        if (lo[z] < 0 || n[z] < 0 || snap_off[z + 1] < snap_off[z]) return -3;
        for (int64_t e = snap_off[z]; e < snap_off[z + 1]; e++)
            if (snap_row[e] < 0 || snap_row[e] >= n[z]) return -3;
    }
    const gdn_io_t io = {q, k, v, g, beta, o, v_ld, H, S, scale};
    const int64_t ss = S * S, R = S <= 128 ? GDN_ROWS : GDN_ROWS / 2, nb = (S + R - 1) / R;
    const int64_t tasks = n_seq * H * nb;
    if (tasks < 2) nthreads = 1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float *mt = malloc((size_t)(ss + 2 * S) * sizeof(float));  // >= S R (a block)
        if (mt == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (mt == NULL) continue;
            const int64_t z = task / (H * nb), h = task / nb % H, i0 = task % nb * R;
            const float *src = m_in[z] + h * ss;
            float *dst = m_out[z] + h * ss;
            const int64_t e0 = snap_off[z], e1 = snap_off[z + 1];
#if defined(__AVX2__)
            if (S % 8 == 0 && n[z] < GDN_BLOCK_MIN) {  // a few rows: the whole head per token
                if (i0 > 0) continue;
                if (n[z] == 0) memcpy(dst, src, (size_t)ss * sizeof(float));
                for (int64_t r = 0, e = e0; r < n[z]; r++, src = dst) {
                    const int64_t th = (lo[z] + r) * H + h;
                    const float *vr = v + (lo[z] + r) * v_ld + h * S;
                    head_token(src, dst, k + th * S, q + th * S, vr, g[th], beta[th], scale,
                               o + th * S, mt, S);
                    for (; e < e1 && snap_row[e] == r; e++)
                        memcpy(snap_dst[e] + h * ss, dst, (size_t)ss * sizeof(float));
                }
                continue;
            }
#endif
            const int64_t nr = S - i0 < R ? S - i0 : R;
            row_block_in(src + i0 * S, mt, nr, S);
            if (nr == GDN_ROWS)
                block_run(&io, mt, GDN_ROWS, h, i0, lo[z], n[z], snap_row, snap_dst, e0, e1);
            else if (nr == GDN_ROWS / 2)
                block_run(&io, mt, GDN_ROWS / 2, h, i0, lo[z], n[z], snap_row, snap_dst, e0, e1);
            else
                block_run(&io, mt, nr, h, i0, lo[z], n[z], snap_row, snap_dst, e0, e1);
            row_block_out(mt, dst + i0 * S, nr, S);
        }
        free(mt);
    }
    return failed ? -1 : 0;
}

int ls_gated_act(const float *g, const float *u, int64_t T, int64_t F, int64_t ld, int act,
                 float *out, int nthreads);

// One row of one sequence through a recurrent layer's causal depthwise conv (a decode step of
// the delta-net and Mamba-2 mixers): pre[c] = sum_j rows[j][c] * taps[j C + c], in order
// j = 0..L-1, where rows are the state's L-1 conv rows st [L-1, C] and then x [C], plus bias[c]
// (NULL: none); act = SiLU(pre) as ls_gated_act(pre, ones) computes it (ones [C] of 1.0f);
// conv_out [(L-1) C] gets the conv rows after this one (st's last L-2 rows, then x). Every
// product is rounded before it is added (-ffp-contract=off): the bits of the torch
// reference's multiply and add per tap (shortconv.causal_conv) on these values.
// Returns 0, or -3 for sizes that do not fit (C or L below 1, a row pointer missing).
int ls_conv_step(const float *st, const float *x, const float *taps, const float *bias,
                 int64_t C, int64_t L, const float *ones, float *pre, float *act,
                 float *conv_out) {
    if (C < 1 || L < 1 || !x || !taps || !ones || !pre || !act || (L > 1 && (!st || !conv_out)))
        return -3;
    for (int64_t c = 0; c < C; c++) {
        float acc = (L > 1 ? st[c] : x[c]) * taps[c];
        for (int64_t j = 1; j < L; j++) {
            const float r = j < L - 1 ? st[j * C + c] : x[c];
            acc = acc + r * taps[j * C + c];
        }
        if (bias != NULL) acc = acc + bias[c];
        pre[c] = acc;
    }
    ls_gated_act(pre, ones, 1, C, C, 0, act, 1);  // act code 0: SiLU (rowops.ACTS)
    if (L > 1) {
        memmove(conv_out, st + C, sizeof(float) * (size_t)((L - 2) * C));
        memcpy(conv_out + (L - 2) * C, x, sizeof(float) * (size_t)C);
    }
    return 0;
}

#include "deltanet_step.h"
