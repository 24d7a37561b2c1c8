// Weights repacked once at load so that a vector's lanes are 8 different weight rows
// ("packed" types; the layouts are written by repack.c). In a row's own layout a block's
// 32 products lie in one vector and every (row, block) ends in a horizontal sum, an int ->
// float conversion and a multiply-add per 32 values: ~1.5 instructions per block beyond
// the two integer multiplies that share one port on AVX2 (the bound of quant_dot.h). Here
// a vector holds 4 consecutive values of each of 8 rows: the sums over a block are vertical
// adds, the 4-bit types add 8 products in int16 before one widening multiply (which also
// applies the sub-block scale), and the float steps run once per block for 8 rows.
//
// Numbers: each output lane is one weight row against one activation row, with the same
// integer sums (exact) and the same float steps whatever M, the tile or the thread:
//   Q8_0, Q5_0, Q4_0:  y = 0; for each block c:  y = isum_c * (dw_c * dx_c) + y  (fused)
//   Q4_K:  the float sequence of kquant.h, so the same bits as the rows read in place
// Layouts, per group of 8 rows, then per block (32 values) or super-block (Q4_K: 256):
//   Q8_0  272 B: f16 d[8] | int8 v[8 steps t][8 rows][4]       (v: values 4t .. 4t + 3)
//   Q5_0  176 B: f16 d[8] | hb[8 rows][4] | nibbles[4 u][8 rows][4]
//   Q5_1  192 B: f16 d[8] | f16 m[8] | hb[8 rows][4] | nibbles[4 u][8 rows][4]
//   Q4_0  144 B: f16 d[8] | nibbles[4 u][8 rows][4]      (IQ4_NL the same: packed_nl.h)
//                (nibbles: low = step u, high = step u + 4; hb: bit t = the fifth bit of
//                value 4t + i of the row, for byte 4 * row + i)
//   Q4_K 1184 B: f16 d[8] | f16 dmin[8] | u8 sc[8][8 rows] | u8 mn[8][8 rows] |
//                nibbles[4 pairs g][8 steps t][8 rows][4]: low = sub-block 2g, high = 2g + 1
//   Q5_K 1440 B: Q4_K's 1184, then hb[4 pairs g][2][8 rows][4] (packed_k.h)
//   MXFP4  136 B: u8 e8m0 exponents[8] | nibbles as Q4_0 (packed_nl.h)
//   IQ4_XS 1104 B: packed_xs.h
//   Q6_K 1680 B: packed_q6.h (pack_q6k.h's layout)
//   Q3_K  912 B, Q2_K 672 B, TQ2_0 528 B: packed_q3.h

#pragma once

#include "quant_blocks.h"
#include "simd.h"

// Read-ahead of the decode tiles (M <= 4: one group at a time, qparts.h's pk_task_groups):
// simd.h's PREFETCH, PREFETCH_AHEAD bytes past the bytes a step reads, in the one stream a
// thread's consecutive groups make. The tiles first asked for the next group's bytes at the
// pace of this one's, a group's size ahead (7-60 KB: past the 32 KB L1 for long rows, where
// the non-temporal lines were gone before their use); measured (Zen 4, AVX-512 build, 2
// threads, ~400 MB of matrices cycled, GB/s, next group -> 2 KB ahead): Q6_K 2560 x 9216
// 26.5 -> 30.2-31.3, Q4_K 2560 x 9216 24.2-25.4 -> 26.7-27.1, Q6_K 8192 x 2560 25.3-34.7 ->
// 38.5, Q4_K 9216 x 2560 unchanged (~30); the AVX2 build the same way. Hints: the same bits.
// PK_AHEAD: the pair tiles' read-ahead (packed_z.h), the next pair in its byte order at the
// pace this one is read; those tiles run for 5..15 rows now, where it is off.
#define PK_AHEAD(p) __builtin_prefetch((const char *)(p), 0, 0)

#define PACKED 256  // a packed type's code: PACKED | its ggml type
#define PK_ROWS 8

// Runs the tile macro T with R (1..4) activation rows as a compile-time constant, as each
// packed tile takes its row count.
#define PK_BY_ROWS(R, T)                                                                      \
    do {                                                                                      \
        switch (R) {                                                                          \
        case 4: T(4); break;                                                                  \
        case 3: T(3); break;                                                                  \
        case 2: T(2); break;                                                                  \
        default: T(1); break;                                                                 \
        }                                                                                     \
    } while (0)

static inline int packable(int type) {
    return type == T_Q8_0 || type == T_Q5_0 || type == T_Q4_0 || type == T_Q4_K ||
           type == T_IQ4_NL || type == T_IQ4_XS || type == T_Q5_1 || type == T_Q6_K ||
           type == T_MXFP4 || type == T_Q5_K || type == T_Q3_K || type == T_Q2_K || type == T_TQ2_0;
}

// values per block of a packable type's layout (a row's K a multiple of it)
static inline int64_t packed_block(int type) {
    return type == T_Q4_K || type == T_Q5_K || type == T_IQ4_XS || type == T_Q6_K || type == T_Q3_K ||
                       type == T_Q2_K || type == T_TQ2_0
               ? 256
               : 32;
}

// bytes per group of 8 rows of K values (0: not packable)
static inline int64_t packed_group_bytes(int type, int64_t K) {
    switch (type) {
    case T_Q8_0: return K / 32 * 272;
    case T_Q5_0: return K / 32 * 176;
    case T_Q5_1: return K / 32 * 192;
    case T_Q4_0:
    case T_IQ4_NL: return K / 32 * 144;  // Q4_0's layout (packed_nl.h)
    case T_MXFP4: return K / 32 * 136;   // u8 e8m0[8] | Q4_0's nibbles (packed_nl.h)
    case T_Q4_K: return K / 256 * 1184;
    case T_Q5_K: return K / 256 * 1440;  // Q4_K's, then the fifth bits (packed_k.h)
    case T_IQ4_XS: return K / 256 * 1104;  // packed_xs.h
    case T_Q6_K: return K / 256 * 1680;    // packed_q6.h
    case T_Q3_K: return K / 256 * 912;     // packed_q3.h
    case T_Q2_K: return K / 256 * 672;     // packed_q3.h
    case T_TQ2_0: return K / 256 * 528;    // packed_q3.h
    default: return 0;
    }
}

// the 8 rows' f16 scales as floats (exact)
static inline void pk_halves(const uint8_t *p, float out[8]) {
    for (int r = 0; r < 8; r++) out[r] = half_to_float(p + 2 * r);
}

#if defined(__AVX2__)
static inline __m256 pk_halves8(const uint8_t *p) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    float f[8];
    pk_halves(p, f);
    return _mm256_loadu_ps(f);
#endif
}

// the 4 bytes at p in every 32-bit lane
static inline __m256i pk_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// 8 unsigned bytes (one per row) as int16 pairs (s, s) in the rows' 32-bit lanes
static inline __m256i pk_pair16(const uint8_t *p) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}
#endif

#if defined(__AVX2__)
// S(r, acc r, y r) for the rows r < R of a tile (R a compile-time constant), and the tile's
// stores: the per-row steps every packed kernel ends a block and its row with
#define PK_EACH(S, a, yy)                                                                     \
    do {                                                                                      \
        S(0, a##0, yy##0);                                                                    \
        if (R > 1) S(1, a##1, yy##1);                                                         \
        if (R > 2) S(2, a##2, yy##2);                                                         \
        if (R > 3) S(3, a##3, yy##3);                                                         \
    } while (0)
static inline __attribute__((always_inline)) void pk_store(float *y, int64_t ldy, int R,
                                                           __m256 y0, __m256 y1, __m256 y2,
                                                           __m256 y3) {
    _mm256_storeu_ps(y, y0);
    if (R > 1) _mm256_storeu_ps(y + ldy, y1);
    if (R > 2) _mm256_storeu_ps(y + 2 * ldy, y2);
    if (R > 3) _mm256_storeu_ps(y + 3 * ldy, y3);
}
#endif

// 8 rows (group g) of packed Q8_0 against R (1..4, compile-time) activation rows x [R, K]
// with block scales xd [R, K/32]: y[r * ldy + 0..7].
static inline __attribute__((always_inline)) void pk_dot_q8_0(
    const uint8_t *g, const int8_t *x, const float *xd, int64_t K, int R, int ahead,
    float *y, int64_t ldy) {
    const int64_t nc = K / 32;
#if defined(__AVX2__)
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m256i ones = _mm256_set1_epi16(1);
    (void)ones;  // unused where LS_PR is dpbusd
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *blk = g + 272 * c;
        __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
// acc + the 4-product sums |w| * sign(w) x (exact both ways: |w| <= 128, |x| <= 127, so
// maddubs never saturates; dpbusd is that sum in one instruction with AVX-512 VNNI)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_PR(r, acc)                                                                         \
    acc = _mm256_dpbusd_epi32(acc, aw, _mm256_sign_epi8(pk_bcast4(x + (r) * K + 32 * c + 4 * t), w))
#else
#define LS_PR(r, acc)                                                                         \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(                         \
                                    aw, _mm256_sign_epi8(pk_bcast4(x + (r) * K + 32 * c + 4 * t), w)), ones))
#endif
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            if (ahead && !(t & 1)) PREFETCH(blk + 32 * t);
            const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * t));
            const __m256i aw = _mm256_sign_epi8(w, w);  // |w| (128 read unsigned: exact)
            LS_PR(0, i0);
            if (R > 1) LS_PR(1, i1);
            if (R > 2) LS_PR(2, i2);
            if (R > 3) LS_PR(3, i3);
        }
#undef LS_PR
        const __m256 dw = pk_halves8(blk);
#define LS_PF(r, acc, yy)                                                                     \
    yy = madd8(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(dw, _mm256_set1_ps(xd[(r) * nc + c])), yy)
        PK_EACH(LS_PF, i, y);
#undef LS_PF
    }
    pk_store(y, ldy, R, y0, y1, y2, y3);
#else
    (void)ahead;
    for (int r = 0; r < R; r++)
        for (int l = 0; l < 8; l++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < nc; c++) {
                const uint8_t *blk = g + 272 * c;
                int32_t s = 0;
                for (int t = 0; t < 8; t++)
                    for (int i = 0; i < 4; i++)
                        s += (int32_t)(int8_t)blk[16 + 32 * t + 4 * l + i] * x[r * K + 32 * c + 4 * t + i];
                acc = madd1((float)s, half_to_float(blk + 2 * l) * xd[r * nc + c], acc);
            }
            y[r * ldy + l] = acc;
        }
#endif
}

// 8 rows (group g) of packed Q5_0 (hb 1), Q4_0 (hb 0) or Q5_1 (hb 2: unsigned values, then
// y = m * (dx * sum(x)) + y per block) against R (1..4) activation rows x [R, K] with block
// scales xd [R, K/32] and sums bs [R, K/32]: y[r * ldy + 0..7]. (The
// sign trick on the values less their offset measured 1.1x the time: two more operations
// a step.)
static inline __attribute__((always_inline)) void pk_dot_q5_0(
    const uint8_t *g, int hb, const int8_t *x, const float *xd, const int16_t *bs, int64_t K,
    int R, int ahead, float *y, int64_t ldy) {
    const int64_t nc = K / 32, bb = hb == 2 ? 192 : hb ? 176 : 144, off = hb == 2 ? 0 : hb ? 16 : 8;
    const int64_t hoff = hb == 2 ? 32 : 16, noff = bb - 128;
#if defined(__AVX2__)
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0F),
                  b4 = _mm256_set1_epi8(0x10);
    (void)ones;  // unused where LS_PR is dpbusd
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *blk = g + bb * c, *nib = blk + noff;
        if (ahead) PREFETCH(blk), PREFETCH(blk + 64), PREFETCH(blk + 128);
        const __m256i h = hb ? _mm256_loadu_si256((const __m256i *)(blk + hoff)) : _mm256_setzero_si256();
        __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
        // the unsigned values (0..31) as they are: 4 steps add in int16 (31 * 127 * 2 * 4 =
        // 31496), and off * sum(x) comes off once per block: the integers of the signed form.
        // With AVX-512 VNNI each step's 4-product sums go straight into the int32 sums
        // (dpbusd: the same exact integers, one instruction a step and row instead of two,
        // and no widening per 4 steps; the int16 sums stay unused)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_PR(r, acc) i##r = _mm256_dpbusd_epi32(i##r, w, pk_bcast4(x + (r) * K + 32 * c + 4 * t))
#define LS_PS(r, acc, is) (void)(acc)
#else
#define LS_PR(r, acc) acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, pk_bcast4(x + (r) * K + 32 * c + 4 * t)))
#define LS_PS(r, acc, is) is = _mm256_add_epi32(is, _mm256_madd_epi16(acc, ones))
#endif
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
#pragma GCC unroll 4
            for (int t = 4 * half; t < 4 * half + 4; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(nib + 32 * (t & 3)));
                __m256i w = t < 4 ? _mm256_and_si256(v, lo4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                if (hb)  // bit t of each byte to bit 4 (a 16-bit shift: the mask keeps the byte's own)
                    w = _mm256_or_si256(w, _mm256_and_si256(t <= 4 ? _mm256_slli_epi16(h, 4 - t)
                                                                    : _mm256_srli_epi16(h, t - 4), b4));
                LS_PR(0, a0);
                if (R > 1) LS_PR(1, a1);
                if (R > 2) LS_PR(2, a2);
                if (R > 3) LS_PR(3, a3);
            }
            PK_EACH(LS_PS, a, i);
        }
#undef LS_PS
#undef LS_PR
        const __m256 dw = pk_halves8(blk);
#define LS_PF(r, acc, yy)                                                                     \
    yy = madd8(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc, _mm256_set1_epi32((int)off * bs[(r) * nc + c]))), \
               _mm256_mul_ps(dw, _mm256_set1_ps(xd[(r) * nc + c])), yy)
        PK_EACH(LS_PF, i, y);
#undef LS_PF
        if (hb == 2) {  // the offsets m: y = m * (dx * sum(x)) + y
            const __m256 mw = pk_halves8(blk + 16);
#define LS_PM(r, acc, yy) yy = madd8(mw, _mm256_set1_ps(xd[(r) * nc + c] * (float)bs[(r) * nc + c]), yy)
            PK_EACH(LS_PM, i, y);
#undef LS_PM
        }
    }
    pk_store(y, ldy, R, y0, y1, y2, y3);
#else
    (void)ahead;
    (void)bs;
    for (int r = 0; r < R; r++)
        for (int l = 0; l < 8; l++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < nc; c++) {
                const uint8_t *blk = g + bb * c, *nib = blk + noff;
                int32_t s = 0;
                for (int t = 0; t < 8; t++)
                    for (int i = 0; i < 4; i++) {
                        const uint8_t q = nib[32 * (t & 3) + 4 * l + i];
                        int v = t < 4 ? q & 15 : q >> 4;
                        if (hb) v |= ((blk[hoff + 4 * l + i] >> t) & 1) << 4;
                        s += (v - (int)off) * x[r * K + 32 * c + 4 * t + i];
                    }
                acc = madd1((float)s, half_to_float(blk + 2 * l) * xd[r * nc + c], acc);
                if (hb == 2)
                    acc = madd1(half_to_float(blk + 16 + 2 * l), xd[r * nc + c] * (float)bs[r * nc + c], acc);
            }
            y[r * ldy + l] = acc;
        }
#endif
}
