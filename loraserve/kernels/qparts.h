// One weight matrix of a quantized matmul call ("a part") against the call's activations:
// how its rows are read (in place, unpacked, or decoded once into a buffer) and the tiles
// that compute its output columns. Every tile gives each output the same operations in
// the same order (quant_dot.h, kquant.h), so no bit depends on M or on the tiling.

#pragma once

#include <stdlib.h>

#include "kquant.h"

// One call's activations in the forms its parts read: per 32 (q, d, ms: legacy types) and
// per 256 (kq, kd, kbs: K-quants); a form no part reads may be NULL.
typedef struct {
    const int8_t *q;
    const float *d, *ms;
    const float *dT;  // d transposed per 4 rows ([M/4 rounded up][K/32][4]), or NULL
    const int8_t *kq;
    const float *kd;
    const int16_t *kbs, *kbs32;
} act_t;

static int use_direct(int type) {
    // LORASERVE_KERNEL_UNPACK=1: the scalar unpackers for every type (tests compare both)
    return HAVE_DIRECT && direct(type) && getenv("LORASERVE_KERNEL_UNPACK") == NULL;
}

// How one weight matrix is read: its unpacker or in-place decoder, chosen once per call.
typedef struct {
    int type, has_min, in_place, kq;  // kq: a K-quant, on per-256 activations
    unpack_fn unpack;
    dot_fn one, four, eight;
    dot_fn bu4, bu8;  // Q4_0 / Q5_0 in place: 4 and 8 rows on values decoded once (or NULL)
    cols_fn c4;
    kdot_fn k1, k4;
    const uint8_t *w;
    int64_t n, row_bytes, col;  // rows, bytes per row, first output column
} part_t;

static int part_init(part_t *p, int type, const uint8_t *w, int64_t n, int64_t row_bytes,
                     int64_t col) {
    p->unpack = unpacker(type, &p->has_min);
    if (p->unpack == NULL) return -1;
    p->type = type;
    p->in_place = use_direct(type);
    dot_fns(p->in_place ? type : T_BUF, &p->one, &p->four, &p->eight, &p->c4);
    p->bu4 = p->bu8 = NULL;
#if defined(__AVX2__)
    if (p->in_place && (type == T_Q4_0 || type == T_Q5_0)) p->bu4 = dot_bufu_4, p->bu8 = dot_bufu_8;
#endif
    p->kq = is_kquant(type);
    p->k1 = kdot_buf_1;
    p->k4 = kdot_buf_4;
    p->in_place = p->kq ? p->in_place && (type == T_Q4_K || type == T_Q6_K) : p->in_place;
#if defined(__AVX2__)
    if (p->kq && p->in_place) {
        p->k1 = type == T_Q4_K ? kdot_q4_k_1 : kdot_q6_k_1;
        p->k4 = type == T_Q4_K ? kdot_q4_k_4 : kdot_q6_k_4;
    }
#endif
    p->w = w;
    p->n = n;
    p->row_bytes = row_bytes;
    p->col = col;
    return 0;
}

typedef struct {
    int8_t *qbuf;
    float *s, *mn, *sv;
    kprep_t kp;  // a K-quant row's integer scales (qbuf holds its values when unpacked)
    int8_t *qb4[4];  // four rows' buffers and scales, for dot_cols
    float *s4[4], *mn4[4];
} scratch_t;

static void scratch_init(scratch_t *t, int64_t K) {
    const size_t qn = (size_t)((K + 63) / 64 * 64), sn = (size_t)(K / 16);
    t->qbuf = aligned_alloc(64, qn);
    t->s = malloc(sizeof(float) * sn);
    t->mn = calloc(sn, sizeof(float));
    t->sv = malloc(sizeof(float) * (size_t)(8 * (K / 32)));
    t->kp.sc = malloc(sizeof(int16_t) * (sn + 16));
    t->kp.mn = malloc(sizeof(int16_t) * (sn + 16));
    t->kp.d = malloc(sizeof(float) * (size_t)(K / 256 + 1));
    t->kp.dm = malloc(sizeof(float) * (size_t)(K / 256 + 1));
    t->kp.q = t->qbuf;
    t->kp.ahead = 0;
    for (int j = 0; j < 4; j++) {
        t->qb4[j] = aligned_alloc(64, qn);
        t->s4[j] = malloc(sizeof(float) * sn);
        t->mn4[j] = calloc(sn, sizeof(float));
    }
}

static void scratch_free(scratch_t *t) {
    free(t->qbuf);
    free(t->s);
    free(t->mn);
    free(t->sv);
    free(t->kp.sc);
    free(t->kp.mn);
    free(t->kp.d);
    free(t->kp.dm);
    for (int j = 0; j < 4; j++) {
        free(t->qb4[j]);
        free(t->s4[j]);
        free(t->mn4[j]);
    }
}

// Output columns p->col + n0 .. + 3 of rows m < M (M < 4): four weight rows at a time.
static void part_cols4(const part_t *p, int64_t n0, int64_t K, const act_t *a, int64_t M,
                       float *y, int64_t ldy, scratch_t *t) {
    const int64_t nc = K / 32;
    const uint8_t *rows[4];
    for (int j = 0; j < 4; j++) {
        rows[j] = p->w + (n0 + j) * p->row_bytes;
        if (p->in_place) row_scales(p->type, rows[j], K, t->s4[j], t->mn4[j]);
        else p->unpack(rows[j], K, t->qb4[j], t->s4[j], t->mn4[j]);
    }
    for (int64_t m = 0; m < M; m++) {
        float out[4];
        p->c4(rows, t->qb4, t->s4, t->mn4, p->has_min, a->q + m * K, a->d + m * nc,
              a->ms + m * (K / 16), K, out);
        for (int j = 0; j < 4; j++) y[m * ldy + p->col + n0 + j] = out[j];
    }
}

// From these many activation rows on, a weight row is decoded once into the buffer rather
// than in every pass over 8 (Q4_0, Q5_0) or 4 (Q6_K) activation rows. Measured (Zen 2, 2
// threads, Gemma 270M, against decoding in place): Q5_0 2048 x 640 at 16 / 24 / 64 / 512
// rows 1.04x / 0.98x / 0.98x / 0.94x the time; Q6_K 640 x 2048 (6-bit values, ~12
// instructions a chunk) at 12 / 16 / 24 / 64 / 512 rows 1.05x / 0.97x / 0.92x / 0.80x /
// 0.79x. Q4_K's in-place decode is cheap: its buffer passes were no faster. Same bits.
#define BUF_ROWS 24
#define KBUF_ROWS 16

// Output column (p->col + n) of all M rows of a K-quant part: one weight row against every
// activation row, 4 at a time (the same numbers as one at a time: kquant.h).
static void part_row_k(const part_t *p, int64_t n, int64_t K, const act_t *a, int64_t M,
                       float *y, int64_t ldy, scratch_t *t) {
    const uint8_t *row = p->w + n * p->row_bytes;
    kdot_fn k4 = p->k4, k1 = p->k1;
    if (!p->in_place) {
        k_prepare(p->type, row, K, &t->kp, 1, t->s, t->mn);
#if defined(__AVX2__)
    } else if (p->type == T_Q6_K && M >= KBUF_ROWS) {  // decode once, then read the buffer
        k_prepare(p->type, row, K, &t->kp, 0, NULL, NULL);
        decode_values(p->type, row, K, t->kp.q);
        k4 = kdot_buf_4, k1 = kdot_buf_1;
#endif
    }
    t->kp.ahead = M <= 4;
    float *out = y + p->col + n;
    const int64_t nb = K / 256, n16 = K / 16;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)
        k4(row, &t->kp, p->has_min, a->kq + m * K, a->kd + m * nb, a->kbs + m * n16,
           a->kbs32 + m * (K / 32), K, out + m * ldy, ldy);
    for (; m < M; m++)
        k1(row, &t->kp, p->has_min, a->kq + m * K, a->kd + m * nb, a->kbs + m * n16,
           a->kbs32 + m * (K / 32), K, out + m * ldy, ldy);
}

// Output column (p->col + n) of all M rows: one weight row against every activation row.
static void part_row(const part_t *p, int64_t n, int64_t K, const act_t *a, int64_t M,
                     float *y, int64_t ldy, scratch_t *t) {
    if (p->kq) {
        part_row_k(p, n, K, a, M, y, ldy, t);
        return;
    }
    const int64_t nc = K / 32;
    const uint8_t *row = p->w + n * p->row_bytes;
    if (p->in_place) row_scales(p->type, row, K, t->s, t->mn);
    else p->unpack(row, K, t->qbuf, t->s, t->mn);
    if (M >= 4 && !(p->in_place && UNIFORM(p->type)))
        for (int64_t c = 0; c < nc; c++)
            for (int l = 0; l < 4; l++) {
                t->sv[8 * c + l] = t->s[2 * c];
                t->sv[8 * c + 4 + l] = t->s[2 * c + 1];
            }
    float *out = y + p->col + n;
    int64_t m = 0;
    dot_fn eight = p->eight, four = p->four;
#if defined(__AVX2__)
    if (p->bu8 != NULL && M >= BUF_ROWS) {  // decode once, then read the buffer
        decode_values(p->type, row, K, t->qbuf);
        eight = p->bu8, four = p->bu4;
    }
#endif
#define LS_DT(m) (a->dT != NULL ? a->dT + (m) / 4 * nc * 4 : NULL)
    for (; m + 8 <= M; m += 8)
        eight(row, t->qbuf, t->s, t->sv, t->mn, p->has_min, a->q + m * K, a->d + m * nc,
              LS_DT(m), a->ms + m * (K / 16), K, out + m * ldy, ldy);
    for (; m + 4 <= M; m += 4)
        four(row, t->qbuf, t->s, t->sv, t->mn, p->has_min, a->q + m * K, a->d + m * nc,
             LS_DT(m), a->ms + m * (K / 16), K, out + m * ldy, ldy);
#undef LS_DT
    for (; m < M; m++)
        p->one(row, t->qbuf, t->s, t->sv, t->mn, p->has_min, a->q + m * K, a->d + m * nc, NULL,
               a->ms + m * (K / 16), K, out + m * ldy, ldy);
}
