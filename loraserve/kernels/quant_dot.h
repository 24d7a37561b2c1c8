// The kernels' inner loops: one weight row against 1 or 4 activation rows (dot_rows) and 4
// weight rows against one activation row (dot_cols), on int8 blocks with float scaling in
// one fixed order per output, whatever the tiling.

#pragma once

#include "quant_blocks.h"
#include "quant_chunk.h"
#include "simd.h"

// ---- dot products ----------------------------------------------------------------------

// sum_j mn[j] * xms[j]: the offsets' contribution (types with a min), in one fixed order
// (8 lanes, then the lanes' sum, then the tail), the same for every caller.
static inline float min_term(const float *mn, const float *xms, int64_t n) {
    int64_t j = 0;
    float t = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8)
        acc = madd8(_mm256_loadu_ps(mn + j), _mm256_loadu_ps(xms + j), acc);
    t = hsum8(acc);
#endif
    for (; j < n; j++) t += mn[j] * xms[j];
    return t;
}

// One weight row against R activation rows (R a compile-time constant: 1, 4 or 8). Every
// output gets exactly the same operations in the same order whatever R is and whether the
// values are decoded in place or read from the unpack buffer, so no bit depends on the
// batch. s/mn: scales and offsets per 16 values (mn with has_min; the types decoded in
// place read their scales from the row instead); sv: the scales as one 8-lane vector per
// chunk (R >= 4 only).
static inline __attribute__((always_inline)) void dot_rows(
    int type, const uint8_t *row, const int8_t *qbuf, const float *s, const float *sv,
    const float *mn, int has_min, const int8_t *x, const float *xd, const float *xdT,
    const float *xms, int64_t K, int R, float *out, int64_t ldy) {
    const int64_t nc = K / 32;
#if defined(__AVX2__)
    // named accumulators (an array of them was spilled to the stack every chunk)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_DOT(aw, sx) _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx)
#else
#define LS_DOT(aw, sx) _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1))
#endif
    // exact: |w| <= 128 and |x| <= 127, so no int16 pair sum saturates
    // With a one-scale type, 4 or 8 rows and the scales transposed (xdT: per 4 rows, nc x 4),
    // the rows' scale products s[c] * xd[r][c] are one vector multiply per 4 rows, each row
    // then broadcasting its own from the stack (a load, not an ALU operation): the same
    // float products, one instruction fewer per row and chunk.
    const int tsc = UNIFORM(type) && R >= 4 && xdT != NULL;
    float scr[8] __attribute__((aligned(32)));
#define LS_ROW(r, acc)                                                                        \
    do {                                                                                      \
        __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x + (r) * K + 32 * c)), w); \
        __m256 sc = tsc ? _mm256_broadcast_ss(scr + (r))                                     \
                        : _mm256_mul_ps(scw, _mm256_broadcast_ss(xd + (r) * nc + c));          \
        acc = madd8(_mm256_cvtepi32_ps(LS_DOT(aw, sx)), sc, acc);                             \
    } while (0)
    for (int64_t c = 0; c < nc; c++) {
        // (4 rows: at most one such call per weight row in a prompt's many rows)
        if (R <= 4 && CHUNK_BYTES(type)) PREFETCH(row + CHUNK_BYTES(type) * c);
        __m256i w = chunk_values(type, row, qbuf, c);
        __m256i aw = _mm256_sign_epi8(w, w);
        // in place: the block's own f16 scale (the value row_scales would have written)
        __m256 scw = CHUNK_BYTES(type) ? _mm256_set1_ps(chunk_scale(type, row, c))
                     : UNIFORM(type) ? _mm256_broadcast_ss(s + c)
                     : R == 1   ? _mm256_set_m128(_mm_set1_ps(s[2 * c + 1]), _mm_set1_ps(s[2 * c]))
                                : _mm256_loadu_ps(sv + 8 * c);
        if (tsc) {
            _mm_store_ps(scr, _mm_mul_ps(_mm256_castps256_ps128(scw), _mm_loadu_ps(xdT + 4 * c)));
            if (R == 8)
                _mm_store_ps(scr + 4, _mm_mul_ps(_mm256_castps256_ps128(scw),
                                                 _mm_loadu_ps(xdT + 4 * nc + 4 * c)));
        }
        LS_ROW(0, a0);
        if (R >= 4) {
            LS_ROW(1, a1);
            LS_ROW(2, a2);
            LS_ROW(3, a3);
        }
        if (R == 8) {
            LS_ROW(4, a4);
            LS_ROW(5, a5);
            LS_ROW(6, a6);
            LS_ROW(7, a7);
        }
    }
#undef LS_ROW
    out[0] = hsum8(a0);
    if (R >= 4) {
        out[ldy] = hsum8(a1);
        out[2 * ldy] = hsum8(a2);
        out[3 * ldy] = hsum8(a3);
    }
    if (R == 8) {
        out[4 * ldy] = hsum8(a4);
        out[5 * ldy] = hsum8(a5);
        out[6 * ldy] = hsum8(a6);
        out[7 * ldy] = hsum8(a7);
    }
#else
    (void)type;
    (void)row;
    (void)sv;
    (void)xdT;
    for (int r = 0; r < R; r++) {
        float t = 0.0f;
        for (int64_t c = 0; c < nc; c++)
            for (int h = 0; h < 2; h++) {
                int32_t i = 0;
                for (int l = 0; l < 16; l++)
                    i += (int32_t)qbuf[32 * c + 16 * h + l] * (int32_t)x[r * K + 32 * c + 16 * h + l];
                t += (float)i * (s[2 * c + h] * xd[r * nc + c]);
            }
        out[r * ldy] = t;
    }
#endif
    if (has_min)
        for (int r = 0; r < R; r++) out[r * ldy] += min_term(mn, xms + r * (K / 16), K / 16);
}

// NR weight rows (a compile-time constant: 4) against one activation row: for decode,
// where one row's chain of dependent multiply-adds would leave the core waiting. Each
// output gets exactly the operations dot_rows gives it, so tiling changes no bit.
static inline __attribute__((always_inline)) void dot_cols(
    int type, const uint8_t *const *rows, int8_t *const *qb, float *const *s, float *const *mn,
    int has_min, const int8_t *x, const float *xd, const float *xms, int64_t K, int NR,
    float *out) {
#if defined(__AVX2__)
    const int64_t nc = K / 32;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define LS_COL(j, acc)                                                                        \
    do {                                                                                      \
        __m256i w = chunk_values(type, rows[j], qb[j], c);                                    \
        __m256i aw = _mm256_sign_epi8(w, w), sx = _mm256_sign_epi8(xv, w);                    \
        __m256 sc = _mm256_mul_ps(                                                            \
            UNIFORM(type) ? _mm256_broadcast_ss(s[j] + c)                                    \
                          : _mm256_set_m128(_mm_set1_ps(s[j][2 * c + 1]), _mm_set1_ps(s[j][2 * c])), \
            bxd);                                                                             \
        acc = madd8(_mm256_cvtepi32_ps(LS_DOT(aw, sx)), sc, acc);                             \
    } while (0)
    for (int64_t c = 0; c < nc; c++) {
        if (CHUNK_BYTES(type)) {  // the 4 rows are one run of bytes: 4 chunks' worth a step
            PREFETCH(rows[0] + 4 * CHUNK_BYTES(type) * c);
            PREFETCH(rows[0] + 4 * CHUNK_BYTES(type) * c + 64);
        }
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 32 * c));
        __m256 bxd = _mm256_broadcast_ss(xd + c);
        LS_COL(0, a0);
        LS_COL(1, a1);
        LS_COL(2, a2);
        LS_COL(3, a3);
    }
#undef LS_COL
    (void)NR;  // always 4
    out[0] = hsum8(a0);
    out[1] = hsum8(a1);
    out[2] = hsum8(a2);
    out[3] = hsum8(a3);
    if (has_min)
        for (int j = 0; j < NR; j++) out[j] += min_term(mn[j], xms, K / 16);
#else
    for (int j = 0; j < NR; j++)
        dot_rows(type, rows[j], qb[j], s[j], NULL, mn[j], has_min, x, xd, NULL, xms, K, 1, out + j, 1);
#endif
}

#define DOT_FNS(T, NAME)                                                                      \
    static void NAME##_1(const uint8_t *row, const int8_t *qb, const float *s, const float *sv, \
                         const float *mn, int hm, const int8_t *x, const float *xd,             \
                         const float *xdT, const float *xms, int64_t K, float *out, int64_t ldy) { \
        dot_rows(T, row, qb, s, sv, mn, hm, x, xd, xdT, xms, K, 1, out, ldy);                  \
    }                                                                                         \
    static void NAME##_4(const uint8_t *row, const int8_t *qb, const float *s, const float *sv, \
                         const float *mn, int hm, const int8_t *x, const float *xd,             \
                         const float *xdT, const float *xms, int64_t K, float *out, int64_t ldy) { \
        dot_rows(T, row, qb, s, sv, mn, hm, x, xd, xdT, xms, K, 4, out, ldy);                  \
    }                                                                                         \
    static void NAME##_8(const uint8_t *row, const int8_t *qb, const float *s, const float *sv, \
                         const float *mn, int hm, const int8_t *x, const float *xd,             \
                         const float *xdT, const float *xms, int64_t K, float *out, int64_t ldy) { \
        dot_rows(T, row, qb, s, sv, mn, hm, x, xd, xdT, xms, K, 8, out, ldy);                  \
    }                                                                                         \
    static void NAME##_c4(const uint8_t *const *rows, int8_t *const *qb, float *const *s,        \
                          float *const *mn, int hm, const int8_t *x, const float *xd,           \
                          const float *xms, int64_t K, float *out) {                            \
        dot_cols(T, rows, qb, s, mn, hm, x, xd, xms, K, 4, out);                               \
    }
typedef void (*cols_fn)(const uint8_t *const *, int8_t *const *, float *const *, float *const *,
                        int, const int8_t *, const float *, const float *, int64_t, float *);
typedef void (*dot_fn)(const uint8_t *, const int8_t *, const float *, const float *,
                       const float *, int, const int8_t *, const float *, const float *,
                       const float *, int64_t, float *, int64_t);
DOT_FNS(T_BUF, dot_buf)
#if defined(__AVX2__)
DOT_FNS(T_BUFU, dot_bufu)
DOT_FNS(T_Q8_0, dot_q8_0)
DOT_FNS(T_Q4_0, dot_q4_0)
DOT_FNS(T_Q5_0, dot_q5_0)
DOT_FNS(T_IQ4_NL, dot_iq4_nl)
DOT_FNS(T_MXFP4, dot_mxfp4)
#endif

static void dot_fns(int type, dot_fn *one, dot_fn *four, dot_fn *eight, cols_fn *c4) {
    *one = dot_buf_1;
    *four = dot_buf_4;
    *eight = dot_buf_8;
    *c4 = dot_buf_c4;
#if defined(__AVX2__)
    switch (type) {
    case T_Q8_0:
        *one = dot_q8_0_1, *four = dot_q8_0_4, *eight = dot_q8_0_8, *c4 = dot_q8_0_c4;
        break;
    case T_Q4_0:
        *one = dot_q4_0_1, *four = dot_q4_0_4, *eight = dot_q4_0_8, *c4 = dot_q4_0_c4;
        break;
    case T_Q5_0:
        *one = dot_q5_0_1, *four = dot_q5_0_4, *eight = dot_q5_0_8, *c4 = dot_q5_0_c4;
        break;
    case T_IQ4_NL:
        *one = dot_iq4_nl_1, *four = dot_iq4_nl_4, *eight = dot_iq4_nl_8, *c4 = dot_iq4_nl_c4;
        break;
    case T_MXFP4:
        *one = dot_mxfp4_1, *four = dot_mxfp4_4, *eight = dot_mxfp4_8, *c4 = dot_mxfp4_c4;
        break;
    }
#endif
}
