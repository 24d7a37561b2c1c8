// The tiles of one weight matrix of a quantized matmul call ("a part", qpart.h) against the
// call's activations: each weight row prepared (unpacked, or decoded once into a buffer) and
// the tiles that compute its output columns. Every tile gives each output the same operations in
// the same order (quant_dot.h, kquant.h), so no bit depends on M or on the tiling.

#pragma once

#include <stdlib.h>
#include <string.h>

#include "qpart.h"

// One weight row prepared for a pass over activation rows: its values (when unpacked or
// decoded once), scales and offsets, and the dot products that read them.
typedef struct {
    int8_t *qbuf;
    float *s, *mn, *sv;
    kprep_t kp;  // a K-quant row's integer scales (qbuf holds its values when unpacked)
    dot_fn four, eight;
    kdot_fn k1, k4;
} rowbuf_t;

typedef struct {
    rowbuf_t r[4];  // up to 4 weight rows at a time (part_rows, part_cols4)
    uint8_t *kb;    // a task's decoded groups (part_kbytes), allocated on first use
    void *mem;      // the rows' buffers, one allocation (a decode step makes ~100 calls)
} scratch_t;

// The 4 row buffers for K values carved from one 64-byte aligned allocation (each piece a
// multiple of 64 bytes), mn zeroed as the types without a minimum read it; NULL pointers
// when out of memory, as separate allocations would give.
static void scratch_init(scratch_t *t, int64_t K) {
    const size_t qn = (size_t)((K + 63) / 64 * 64), sn = (size_t)(K / 16);
#define LS_UP(n) (((n) + 63) / 64 * 64)
    const size_t fs = LS_UP(sizeof(float) * sn), sv = LS_UP(sizeof(float) * (size_t)(8 * (K / 32)));
    const size_t ks = LS_UP(sizeof(int16_t) * (sn + 16)), kd = LS_UP(sizeof(float) * (size_t)(K / 256 + 1));
    const size_t one = qn + 2 * fs + sv + 2 * ks + 2 * kd;
#undef LS_UP
    uint8_t *m = aligned_alloc(64, 4 * one);
    t->mem = m;
    for (int j = 0; j < 4; j++) {
        rowbuf_t *b = &t->r[j];
        uint8_t *p = m ? m + j * one : NULL;
#define LS_TAKE(T, n) (p ? (T *)((p += (n)) - (n)) : NULL)
        b->qbuf = LS_TAKE(int8_t, qn);
        b->s = LS_TAKE(float, fs);
        b->mn = LS_TAKE(float, fs);
        b->sv = LS_TAKE(float, sv);
        b->kp.sc = LS_TAKE(int16_t, ks);
        b->kp.mn = LS_TAKE(int16_t, ks);
        b->kp.d = LS_TAKE(float, kd);
        b->kp.dm = LS_TAKE(float, kd);
#undef LS_TAKE
        if (b->mn) memset(b->mn, 0, sizeof(float) * sn);
        b->kp.q = b->qbuf;
        b->kp.ahead = 0;
    }
    t->kb = NULL;
}

static void scratch_free(scratch_t *t) {
    free(t->mem);
    free(t->kb);
}

// Output columns p->col + n0 .. + 3 of rows m < M (M < 4): four weight rows at a time.
static void part_cols4(const part_t *p, int64_t n0, int64_t K, const act_t *a, int64_t M,
                       float *y, int64_t ldy, scratch_t *t) {
    const int64_t nc = K / 32;
    const uint8_t *rows[4];
    int8_t *qb[4];
    float *sc[4], *mn[4];
    for (int j = 0; j < 4; j++) {
        rowbuf_t *b = &t->r[j];
        rows[j] = p->w + (n0 + j) * p->row_bytes;
        qb[j] = b->qbuf, sc[j] = b->s, mn[j] = b->mn;
        if (p->in_place) row_scales(p->type, rows[j], K, b->s, b->mn);
        else p->unpack(rows[j], K, b->qbuf, b->s, b->mn);
    }
    for (int64_t m = 0; m < M; m++) {
        float out[4];
        p->c4(rows, qb, sc, mn, p->has_min, a->q + m * K, a->d + m * nc, a->ms + m * (K / 16),
              K, out);
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

// From these many activation rows on, the 4 weight rows of a task take each block of
// activations of about this many bytes in turn (part_rows). Measured (Zen 2, 2 threads,
// 512-token prefills, interleaved): Gemma 270M 1.06 -> 1.00 s, 1B 6.09 -> 5.94 s, 4B 26.1
// -> 24.1 s; blocks of 8 to 64 KB did about as well.
#define ROWS_MIN_M 16
#define ROWS_BLOCK_BYTES 16384

// Prepares weight row n of p in b for M activation rows: unpacked, or its scales read, or
// its values decoded once (many rows), and the dot products chosen that read it so.
static void row_prep(const part_t *p, int64_t n, int64_t K, int64_t M, rowbuf_t *b) {
    const uint8_t *row = p->w + n * p->row_bytes;
    if (p->kq) {
        b->k4 = p->k4, b->k1 = p->k1;
        if (!p->in_place) {
            k_prepare(p->type, row, K, &b->kp, 1, b->s, b->mn);
#if defined(__AVX2__)
        } else if (p->type == T_Q6_K && M >= KBUF_ROWS) {  // decode once, then read the buffer
            decode_values(p->type, row, K, b->kp.q);
            b->k4 = kdot_q6b_4, b->k1 = kdot_q6b_1;
        } else if ((K_GRID(p->type) || p->type == T_TQ2_0 || p->type == T_TQ1_0) && M >= KBUF_ROWS) {
            // their in-place decode (grid lookups) costs more than their unpacking once
            k_prepare(p->type, row, K, &b->kp, 1, b->s, b->mn);
            b->k4 = kdot_buf_4, b->k1 = kdot_buf_1;
#endif
        }
        b->kp.ahead = M <= 4;
        return;
    }
    const int64_t nc = K / 32;
    // the in-place dot products read each block's scale from the row (quant_dot.h); the
    // values decoded once into the buffer read them from b->s
    if (!p->in_place) p->unpack(row, K, b->qbuf, b->s, b->mn);
    else if (p->bu8 != NULL && M >= BUF_ROWS) row_scales(p->type, row, K, b->s, b->mn);
    if (M >= 4 && !(p->in_place && UNIFORM(p->type)))
        for (int64_t c = 0; c < nc; c++)
            for (int l = 0; l < 4; l++) {
                b->sv[8 * c + l] = b->s[2 * c];
                b->sv[8 * c + 4 + l] = b->s[2 * c + 1];
            }
    b->eight = p->eight, b->four = p->four;
#if defined(__AVX2__)
    if (p->bu8 != NULL && M >= BUF_ROWS) {  // decode once, then read the buffer
        decode_values(p->type, row, K, b->qbuf);
        b->eight = p->bu8, b->four = p->bu4;
    }
#endif
}

// Output column (p->col + n) of activation rows m0 <= m < m1 from weight row n prepared in
// b: 8 (legacy types) or 4 (K-quants) rows at a time, then one at a time (the same numbers
// whatever the grouping: quant_dot.h, kquant.h). m0: a multiple of 8.
static void row_dots(const part_t *p, int64_t n, int64_t K, const act_t *a, int64_t m0,
                     int64_t m1, float *y, int64_t ldy, const rowbuf_t *b) {
    const uint8_t *row = p->w + n * p->row_bytes;
    float *out = y + p->col + n;
    int64_t m = m0;
    if (p->kq) {
        const int64_t nb = K / 256, n16 = K / 16, n32 = K / 32;
        for (; m + 4 <= m1; m += 4)
            b->k4(row, &b->kp, p->has_min, a->kq + m * K, a->kd + m * nb, a->kbs + m * n16,
                  a->kbs32 + m * n32, K, out + m * ldy, ldy);
        for (; m < m1; m++)
            b->k1(row, &b->kp, p->has_min, a->kq + m * K, a->kd + m * nb, a->kbs + m * n16,
                  a->kbs32 + m * n32, K, out + m * ldy, ldy);
        return;
    }
    const int64_t nc = K / 32;
#define LS_ARGS(m, dT)                                                                        \
    row, b->qbuf, b->s, b->sv, b->mn, p->has_min, a->q + (m) * K, a->d + (m) * nc, (dT),       \
        a->ms + (m) * (K / 16), K, out + (m) * ldy, ldy
#define LS_DT(m) (a->dT != NULL ? a->dT + (m) / 4 * nc * 4 : NULL)
    for (; m + 8 <= m1; m += 8) b->eight(LS_ARGS(m, LS_DT(m)));
    for (; m + 4 <= m1; m += 4) b->four(LS_ARGS(m, LS_DT(m)));
    for (; m < m1; m++) p->one(LS_ARGS(m, NULL));
#undef LS_DT
#undef LS_ARGS
}

// Output column (p->col + n) of all M rows: one weight row against every activation row.
static void part_row(const part_t *p, int64_t n, int64_t K, const act_t *a, int64_t M,
                     float *y, int64_t ldy, scratch_t *t) {
    row_prep(p, n, K, M, &t->r[0]);
    row_dots(p, n, K, a, 0, M, y, ldy, &t->r[0]);
}

// Output columns n0 .. n1 - 1 (at most 4) of all M rows, for many rows: the weight rows
// prepared once each, then each block of activation rows against all of them while the
// block is in L1 (one weight row against all M rows streamed every row's activations
// from L2 or L3 again). The same dot products per output, so the same bits.
static void part_rows(const part_t *p, int64_t n0, int64_t n1, int64_t K, const act_t *a,
                      int64_t M, float *y, int64_t ldy, scratch_t *t) {
    for (int64_t n = n0; n < n1; n++) row_prep(p, n, K, M, &t->r[n - n0]);
    int64_t blk = ROWS_BLOCK_BYTES / K / 8 * 8;
    if (blk < 8) blk = 8;
    for (int64_t m0 = 0; m0 < M; m0 += blk) {
        const int64_t m1 = m0 + blk < M ? m0 + blk : M;
        for (int64_t n = n0; n < n1; n++) row_dots(p, n, K, a, m0, m1, y, ldy, &t->r[n - n0]);
    }
}

// R (1..4) activation rows x [R, K] against packed group g, into out (packed.c)
int ls_packed_tile(int type, const uint8_t *g, const int8_t *x, const float *xd,
                   const int16_t *bs32, int64_t K, int R, int ahead, float *out, int64_t ldy);

// two groups at once (packed.c, packed_z.h: 512-bit vectors, the same bits). Measured (Zen 5,
// 1 thread, thread CPU time, Gemma 270M at 512 rows, alternated with one group at a time):
// Q5_0 2048 x 640 0.55x the time, Q4_K 640 x 2048 0.57x, 640 x 1024 0.60x.
int ls_packed_tile2(int type, const uint8_t *g, int64_t gb, const int8_t *x, const float *xd,
                    const int16_t *bs32, int64_t K, int R, int ahead, float *out, int64_t ldy);
int ls_packed_pairs(int type);

// From ROWS_MIN_M activation rows on, a task takes this many packed groups, each tile of 4
// activation rows against all of them in turn (with one group a task, every row's
// activations came from L3 again for each 8 weight rows). Measured (Zen 2, 2 threads, 512
// rows): Q4_K 10240 x 2560 and 2560 x 10240 0.96x the time. Same bits.
#define PK_TASK_GROUPS 4

// Packed groups a task takes for M activation rows: PK_TASK_GROUPS from ROWS_MIN_M rows on;
// 2 (a pair in one pass, ls_packed_pairs) for 5..15 rows; 1 for the decode tiles (M <= 4).
// A decode tile streams its weights from memory, and a pair reads two streams a group apart
// where one group reads one: measured (Zen 4, 2 threads, alternated in one process) decode
// of the hybrid bench models (bench.hybrid_synth) with pairs -> one group: granitehybrid
// 64.7 -> 76.8 tok/s, qwen35 22.1 -> 25.3; 100352 x 1536 Q6_K alone 5.9 -> 3.9 ms (llama.cpp
// 4.4). Every output has the same bits either way (packed_z.h).
static inline int64_t pk_task_groups(int type, int64_t M) {
    return M >= ROWS_MIN_M ? PK_TASK_GROUPS : M > 4 && ls_packed_pairs(type) ? 2 : 1;
}

// Output columns p->col + n0 .. + 8 ng - 1 of all M rows from the ng packed groups from row
// n0: 4 activation rows at a time, then the rest together (the same numbers per output
// whatever the tile: packed.h).
static void part_packed(const part_t *p, int64_t n0, int64_t ng, int64_t K, const act_t *a,
                        int64_t M, float *y, int64_t ldy) {
    const int64_t gb = packed_group_bytes(p->type, K);
    const int pairs = M > 4 && ls_packed_pairs(p->type);  // pk_task_groups
    for (int64_t m = 0; m < M; m += 4) {
        const int R = M - m < 4 ? (int)(M - m) : 4;
        // the K-quants' activation sums: per 16 for Q6_K, Q3_K, Q2_K and TQ2_0 (packed_q6.h,
        // packed_q3.h), else per 32
        const int ks16 = p->type == T_Q6_K || p->type == T_Q3_K || p->type == T_Q2_K ||
                         p->type == T_TQ2_0;
        const int16_t *ks = ks16 ? a->kbs + m * (K / 16) : a->kbs32 + m * (K / 32);
        for (int64_t j = 0; j < ng; j++) {  // the tile's activations stay in cache
            const uint8_t *g = p->w + (n0 / PK_ROWS + j) * gb;
            float *out = y + m * ldy + p->col + n0 + PK_ROWS * j;
            if (pairs && j + 1 < ng) {  // two groups in one pass (packed_z.h)
                if (p->kq)
                    ls_packed_tile2(p->type, g, gb, a->kq + m * K, a->kd + m * (K / 256), ks, K,
                                    R, M <= 4, out, ldy);
                else
                    ls_packed_tile2(p->type, g, gb, a->q + m * K, a->d + m * (K / 32),
                                    a->bs + m * (K / 32), K, R, M <= 4, out, ldy);
                j++;
            } else if (p->kq)
                ls_packed_tile(p->type, g, a->kq + m * K, a->kd + m * (K / 256), ks, K, R,
                               M <= 4, out, ldy);
            else
                ls_packed_tile(p->type, g, a->q + m * K, a->d + m * (K / 32),
                               a->bs + m * (K / 32), K, R, M <= 4, out, ldy);
        }
    }
}

// the decoded-group tiles of packed.c (packed_kb.h, packed_zb.h)
int ls_kbytes_type(int type);
int64_t ls_kbytes_scratch(int64_t K, int64_t ng);
int ls_kbytes_task(int type, int packed, const uint8_t *w, int64_t row_bytes, int64_t n0,
                   int64_t ng, int64_t K, const int8_t *xq, const float *xd, const int16_t *bs16,
                   int64_t M, float *y, int64_t ldy, uint8_t *buf);
int ls_zbytes_type(int type);
int64_t ls_zbytes_scratch(int64_t K, int64_t ng);
int ls_zbytes_task(int type, const uint8_t *w, int64_t n0, int64_t ng, int64_t K,
                   const int8_t *xq, const float *xd, const int16_t *bs, int64_t M, float *y,
                   int64_t ldy, uint8_t *buf);

// Whether part p reads through decoded groups for M activation rows: a prompt-sized M (the
// decode is once per task, read by every 4 rows), whole groups of 8 rows, and a K-quant with
// 16-value sub-blocks (packed_kb.h; packed: Q2_K, Q3_K, Q6_K, TQ2_0) or a packed type of
// 32-value blocks on AVX-512 (packed_zb.h). LORASERVE_KERNEL_NO_KBYTES=1 keeps the parts' own
// paths (the tests compare both).
static int part_kbytes_on(const part_t *p, int64_t M) {
    if (M < ROWS_MIN_M || p->n % PK_ROWS != 0 || getenv("LORASERVE_KERNEL_NO_KBYTES") != NULL)
        return 0;
    if (!p->kq) return p->packed && ls_zbytes_type(p->type);
    return ls_kbytes_type(p->type) && (!p->packed || p->type == T_Q6_K || p->type == T_Q3_K ||
                                       p->type == T_Q2_K || p->type == T_TQ2_0);
}

// Output columns p->col + n0 .. + 8 ng - 1 of all M rows through decoded groups (packed.c's
// ls_kbytes_task, ls_zbytes_task), the task's scratch allocated on first use; where it cannot
// be, the part's own tiles (the same bits).
static void part_kbytes(const part_t *p, int64_t n0, int64_t ng, int64_t K, const act_t *a,
                        int64_t M, float *y, int64_t ldy, scratch_t *t) {
    if (t->kb == NULL) {
        const int64_t kb = ls_kbytes_scratch(K, PK_TASK_GROUPS), zb = ls_zbytes_scratch(K, PK_TASK_GROUPS);
        t->kb = aligned_alloc(64, (size_t)((kb > zb ? kb : zb) + 63) / 64 * 64);
    }
    if (t->kb != NULL &&
        (p->kq ? ls_kbytes_task(p->type, p->packed, p->w, p->row_bytes, n0, ng, K, a->kq, a->kd,
                                a->kbs, M, y + p->col, ldy, t->kb)
               : ls_zbytes_task(p->type, p->w, n0, ng, K, a->q, a->d, a->bs, M, y + p->col, ldy,
                                t->kb)) == 0)
        return;
    if (p->packed) part_packed(p, n0, ng, K, a, M, y, ldy);
    else
        for (int64_t n = n0; n < n0 + PK_ROWS * ng; n += 4) part_rows(p, n, n + 4, K, a, M, y, ldy, t);
}
