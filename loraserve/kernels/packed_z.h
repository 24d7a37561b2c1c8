// Two packed groups at once in 512-bit vectors (AVX-512 builds): lanes 0..7 are group g's 8
// weight rows, lanes 8..15 the next group's (the layouts of packed.h, unchanged; each step
// loads the two groups' 32 bytes into one vector). Where a 512-bit operation costs what a
// 256-bit one does (Zen 5: 2 dpbusd a cycle at either width, measured 6.4 a ns both ways,
// 204 vs 409 GMAC/s), a pair of groups takes the instructions one group took: Gemma 270M's
// Q5_0 2048 x 640 at 512 rows 0.55x the time of one group at a time (qparts.h).
//
// Numbers: each lane is still one weight row against one activation row, with the exact
// integer sums of the 256-bit kernels (dpbusd) and, per lane, the very float operations of
// their steps (a lane-wise convert, multiply, fused multiply-add), so every output has the
// bits of the one-group kernels, and of the AVX2 build's, whatever the pairing.

#pragma once

#include "packed_nl.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VL__) && defined(__F16C__)
#define PZ_PAIRS 1

// group a's 32 bytes in the low half, group b's in the high half
static inline __m512i pz_load2(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

// the two groups' 8 f16 scales each as 16 floats (exact)
static inline __m512 pz_halves16(const uint8_t *a, const uint8_t *b) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)a), hi = _mm_loadu_si128((const __m128i *)b);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

// a * b + c per lane as madd8 computes it (fused where the CPU has FMA)
static inline __m512 pz_madd16(__m512 a, __m512 b, __m512 c) {
#if defined(__FMA__)
    return _mm512_fmadd_ps(a, b, c);
#else
    return _mm512_add_ps(_mm512_mul_ps(a, b), c);
#endif
}

// the 4 bytes at p in every 32-bit lane
static inline __m512i pz_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// S(r, acc r, y r) for the rows r < R (1..4) of a tile
#define PZ_EACH(S)                                                                            \
    do {                                                                                      \
        S(0, i0, y0);                                                                         \
        if (R > 1) S(1, i1, y1);                                                              \
        if (R > 2) S(2, i2, y2);                                                              \
        if (R > 3) S(3, i3, y3);                                                              \
    } while (0)
#define PZ_STORE(y, ldy)                                                                      \
    do {                                                                                      \
        _mm512_storeu_ps(y, y0);                                                              \
        if (R > 1) _mm512_storeu_ps((y) + (ldy), y1);                                         \
        if (R > 2) _mm512_storeu_ps((y) + 2 * (ldy), y2);                                     \
        if (R > 3) _mm512_storeu_ps((y) + 3 * (ldy), y3);                                     \
    } while (0)

// pk_dot_q5_0's VNNI steps (Q5_0 hb 1, Q4_0 hb 0, Q5_1 hb 2) on groups g and g + gb:
// y[r * ldy + 0..15] for the R (1..4, compile-time) activation rows x [R, K].
static inline __attribute__((always_inline)) void pz_dot_q5_0(
    const uint8_t *g, int64_t gb, int hb, const int8_t *x, const float *xd, const int16_t *bs,
    int64_t K, int R, int ahead, float *y, int64_t ldy) {
    const int64_t nc = K / 32, bb = hb == 2 ? 192 : hb ? 176 : 144, off = hb == 2 ? 0 : hb ? 16 : 8;
    const int64_t hoff = hb == 2 ? 32 : 16, noff = bb - 128;
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *b0 = g + bb * c, *b1 = b0 + gb;
        if (ahead) {  // the next pair in its byte order (packed.h's PK_AHEAD)
            const uint8_t *pf = g + 2 * gb + 2 * bb * c;
            for (int l = 0; l < 2 * bb; l += 64) PK_AHEAD(pf + l);
        }
        const __m512i h = hb ? pz_load2(b0 + hoff, b1 + hoff) : _mm512_setzero_si512();
        __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
#define LS_PR(r, acc, yy) acc = _mm512_dpbusd_epi32(acc, w, pz_bcast4(x + (r) * K + 32 * c + 4 * t))
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m512i v = pz_load2(b0 + noff + 32 * (t & 3), b1 + noff + 32 * (t & 3));
            __m512i w = t < 4 ? _mm512_and_si512(v, lo4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            if (hb)  // bit t of each byte to bit 4 (a 16-bit shift: the mask keeps the byte's own)
                w = _mm512_or_si512(w, _mm512_and_si512(t <= 4 ? _mm512_slli_epi16(h, 4 - t)
                                                                : _mm512_srli_epi16(h, t - 4), b4));
            PZ_EACH(LS_PR);
        }
#undef LS_PR
        const __m512 dw = pz_halves16(b0, b1);
#define LS_PF(r, acc, yy)                                                                     \
    yy = pz_madd16(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32((int)off * bs[(r) * nc + c]))), \
                   _mm512_mul_ps(dw, _mm512_set1_ps(xd[(r) * nc + c])), yy)
        PZ_EACH(LS_PF);
#undef LS_PF
        if (hb == 2) {  // the offsets m: y = m * (dx * sum(x)) + y
            const __m512 mw = pz_halves16(b0 + 16, b1 + 16);
#define LS_PM(r, acc, yy) yy = pz_madd16(mw, _mm512_set1_ps(xd[(r) * nc + c] * (float)bs[(r) * nc + c]), yy)
            PZ_EACH(LS_PM);
#undef LS_PM
        }
    }
    PZ_STORE(y, ldy);
}

// the two groups' 8 e8m0 exponent bytes each as 16 floats (pk_e8m0x8's, exact)
static inline __m512 pz_e8m0x16(const uint8_t *a, const uint8_t *b) {
    const __m512i e = _mm512_cvtepu8_epi32(
        _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b)));
    const __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_sllv_epi32(big, small, _mm512_set1_epi32(0x00200000), e));
}

// pk_dot_iq4_nl's VNNI steps (packed_nl.h: IQ4_NL mx 0, MXFP4 mx 1; the table offset by 128
// into dpbusd, less 128 * sum(x) per block) on groups g and g + gb: y[r * ldy + 0..15] for
// R (1..4) rows x [R, K].
static inline __attribute__((always_inline)) void pz_dot_iq4_nl(
    const uint8_t *g, int64_t gb, int mx, const int8_t *x, const float *xd, const int16_t *bs,
    int64_t K, int R, int ahead, float *y, int64_t ldy) {
    const int64_t nc = K / 32, bb = PK_NL_BYTES(mx), hd = bb - 128;
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __m512i kv = _mm512_broadcast_i32x4(_mm_add_epi8(
        _mm_loadu_si128((const __m128i *)(mx ? KV_MXFP4 : KV_IQ4NL)), _mm_set1_epi8((char)0x80)));
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *b0 = g + bb * c, *b1 = b0 + gb;
        if (ahead) PREFETCH(b0), PREFETCH(b0 + 64), PREFETCH(b0 + 128);
        if (ahead) PREFETCH(b1), PREFETCH(b1 + 64), PREFETCH(b1 + 128);
        __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
#define LS_PR(r, acc, yy) acc = _mm512_dpbusd_epi32(acc, w, pz_bcast4(x + (r) * K + 32 * c + 4 * t))
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m512i v = pz_load2(b0 + hd + 32 * (t & 3), b1 + hd + 32 * (t & 3));
            const __m512i w = _mm512_shuffle_epi8(
                kv, t < 4 ? _mm512_and_si512(v, lo4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4));
            PZ_EACH(LS_PR);
        }
#undef LS_PR
        const __m512 dw = mx ? pz_e8m0x16(b0, b1) : pz_halves16(b0, b1);
#define LS_PF(r, acc, yy)                                                                     \
    yy = pz_madd16(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(128 * bs[(r) * nc + c]))), \
                   _mm512_mul_ps(dw, _mm512_set1_ps(xd[(r) * nc + c])), yy)
        PZ_EACH(LS_PF);
#undef LS_PF
    }
    PZ_STORE(y, ldy);
}
#else
#define PZ_PAIRS 0
#endif

// whether packed `type` has a kernel for two groups at once here (ls_packed_tile2)
static inline int pz_pairs(int type) {
    return PZ_PAIRS && (type == T_Q5_0 || type == T_Q4_0 || type == T_Q5_1 || type == T_Q4_K ||
                        type == T_IQ4_NL || type == T_Q6_K || type == T_IQ4_XS || type == T_MXFP4 ||
                        type == T_Q5_K);
}
