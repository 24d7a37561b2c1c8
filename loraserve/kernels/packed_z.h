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
#include "packed_q6.h"

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
        if (ahead) PREFETCH(b0), PREFETCH(b0 + 64), PREFETCH(b0 + 128);
        if (ahead) PREFETCH(b1), PREFETCH(b1 + 64), PREFETCH(b1 + 128);
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

// pk_dot_iq4_nl's VNNI steps (packed_nl.h: the table offset by 128 into dpbusd, less 128 *
// sum(x) per block) on groups g and g + gb: y[r * ldy + 0..15] for R (1..4) rows x [R, K].
static inline __attribute__((always_inline)) void pz_dot_iq4_nl(
    const uint8_t *g, int64_t gb, const int8_t *x, const float *xd, const int16_t *bs,
    int64_t K, int R, int ahead, float *y, int64_t ldy) {
    const int64_t nc = K / 32;
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __m512i kv = _mm512_broadcast_i32x4(
        _mm_add_epi8(_mm_loadu_si128((const __m128i *)KV_IQ4NL), _mm_set1_epi8((char)0x80)));
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *b0 = g + 144 * c, *b1 = b0 + gb;
        if (ahead) PREFETCH(b0), PREFETCH(b0 + 64), PREFETCH(b0 + 128);
        if (ahead) PREFETCH(b1), PREFETCH(b1 + 64), PREFETCH(b1 + 128);
        __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
#define LS_PR(r, acc, yy) acc = _mm512_dpbusd_epi32(acc, w, pz_bcast4(x + (r) * K + 32 * c + 4 * t))
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m512i v = pz_load2(b0 + 16 + 32 * (t & 3), b1 + 16 + 32 * (t & 3));
            const __m512i w = _mm512_shuffle_epi8(
                kv, t < 4 ? _mm512_and_si512(v, lo4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4));
            PZ_EACH(LS_PR);
        }
#undef LS_PR
        const __m512 dw = pz_halves16(b0, b1);
#define LS_PF(r, acc, yy)                                                                     \
    yy = pz_madd16(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(128 * bs[(r) * nc + c]))), \
                   _mm512_mul_ps(dw, _mm512_set1_ps(xd[(r) * nc + c])), yy)
        PZ_EACH(LS_PF);
#undef LS_PF
    }
    PZ_STORE(y, ldy);
}

// the 8 bytes at a then the 8 at b, zero-extended to 16 int32 lanes
static inline __m512i pz_u8x16(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                                   _mm_loadl_epi64((const __m128i *)b)));
}

// pk_dot_q4_k's VNNI steps (packed_k.h) on groups g and g + gb: y[r * ldy + 0..15] for the R
// (1..4, compile-time) activation rows x [R, K] quantized per 256 (xd [R, K/256], bs32
// [R, K/32]).
static inline __attribute__((always_inline)) void pz_dot_q4_k(
    const uint8_t *g, int64_t gb, const int8_t *x, const float *xd, const int16_t *bs32,
    int64_t K, int R, int ahead, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g + 1184 * b, *b1 = b0 + gb;
        const int8_t *xb = x + 256 * b;
        __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
        for (int gp = 0; gp < 4; gp++) {
            __m512i l0 = _mm512_setzero_si512(), l1 = l0, l2 = l0, l3 = l0;
            __m512i h0 = l0, h1 = l0, h2 = l0, h3 = l0;
            const uint8_t *n0 = b0 + 160 + 256 * gp, *n1 = b1 + 160 + 256 * gp;
#define LS_PR(r, lo, hi)                                                                      \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 64 * gp + 4 * t;                                     \
        lo = _mm512_dpbusd_epi32(lo, wl, pz_bcast4(xr));                                       \
        hi = _mm512_dpbusd_epi32(hi, wh, pz_bcast4(xr + 32));                                  \
    } while (0)
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                if (ahead && !(t & 1)) PREFETCH(n0 + 32 * t), PREFETCH(n1 + 32 * t);
                const __m512i v = pz_load2(n0 + 32 * t, n1 + 32 * t);
                const __m512i wl = _mm512_and_si512(v, lo4);
                const __m512i wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                LS_PR(0, l0, h0);
                if (R > 1) LS_PR(1, l1, h1);
                if (R > 2) LS_PR(2, l2, h2);
                if (R > 3) LS_PR(3, l3, h3);
            }
#undef LS_PR
            // the 32-bit sums times each row's scale (one per lane)
            const __m512i sl = pz_u8x16(b0 + 32 + 16 * gp, b1 + 32 + 16 * gp);
            const __m512i sh = pz_u8x16(b0 + 40 + 16 * gp, b1 + 40 + 16 * gp);
#define LS_PS(lo, hi, acc)                                                                    \
    acc = _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_mullo_epi32(lo, sl), _mm512_mullo_epi32(hi, sh)))
            LS_PS(l0, h0, i0);
            if (R > 1) LS_PS(l1, h1, i1);
            if (R > 2) LS_PS(l2, h2, i2);
            if (R > 3) LS_PS(l3, h3, i3);
#undef LS_PS
        }
        // sum_j mn_j * bs32_j: pairs of sub-blocks (mn_2i, mn_2i+1) per row lane
        __m512i mp[4];
        for (int i = 0; i < 4; i++)
            mp[i] = _mm512_or_si512(pz_u8x16(b0 + 96 + 16 * i, b1 + 96 + 16 * i),
                                    _mm512_slli_epi32(pz_u8x16(b0 + 104 + 16 * i, b1 + 104 + 16 * i), 16));
        const __m512 d = pz_halves16(b0, b1), dm = pz_halves16(b0 + 16, b1 + 16);
#define LS_PF(r, acc, yy)                                                                     \
    do {                                                                                      \
        const int16_t *bs = bs32 + (r) * (K / 32) + 8 * b;                                     \
        __m512i ms = _mm512_madd_epi16(mp[0], _mm512_set1_epi32(*(const int32_t *)bs));        \
        for (int i = 1; i < 4; i++)                                                           \
            ms = _mm512_add_epi32(ms, _mm512_madd_epi16(mp[i], _mm512_set1_epi32(*(const int32_t *)(bs + 2 * i)))); \
        const __m512 xs = _mm512_set1_ps(xd[(r) * nb + b]);                                    \
        yy = _mm512_add_ps(yy, _mm512_mul_ps(_mm512_mul_ps(d, xs), _mm512_cvtepi32_ps(acc)));  \
        yy = _mm512_sub_ps(yy, _mm512_mul_ps(_mm512_mul_ps(dm, xs), _mm512_cvtepi32_ps(ms)));  \
    } while (0)
        PZ_EACH(LS_PF);
#undef LS_PF
    }
    PZ_STORE(y, ldy);
}

// the 8 bytes at a then the 8 at b, sign-extended to 16 int32 lanes
static inline __m512i pz_i8x16(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                                   _mm_loadl_epi64((const __m128i *)b)));
}

// pq6_dot's steps (packed_q6.h) on groups g and g + gb: y[r * ldy + 0..15] for the R (1..4)
// activation rows x [R, K] quantized per 256 (xd [R, K/256], bs16 [R, K/16]).
static inline __attribute__((always_inline)) void pz_dot_q6_k(
    const uint8_t *g, int64_t gb, const int8_t *x, const float *xd, const int16_t *bs16,
    int64_t K, int R, int ahead, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), h2 = _mm512_set1_epi8(0x30),
                  low16 = _mm512_set1_epi32(0xFFFF);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g + PQ6_SB * b, *b1 = b0 + gb;
        const int8_t *xb = x + 256 * b;
        __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
        for (int j = 0; j < 16; j++) {
            const uint8_t *s0 = b0 + 144 + 96 * j, *s1 = b1 + 144 + 96 * j;
            if (ahead) PREFETCH(s0), PREFETCH(s0 + 64), PREFETCH(s1), PREFETCH(s1 + 64);
            const __m512i n0 = pz_load2(s0, s1), n1 = pz_load2(s0 + 32, s1 + 32);
            const __m512i hv = pz_load2(s0 + 64, s1 + 64);
            const __m512i w0 = _mm512_or_si512(_mm512_and_si512(n0, lo4),
                                               _mm512_and_si512(_mm512_slli_epi16(hv, 4), h2));
            const __m512i w1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n0, 4), lo4),
                                               _mm512_and_si512(_mm512_slli_epi16(hv, 2), h2));
            const __m512i w2 = _mm512_or_si512(_mm512_and_si512(n1, lo4), _mm512_and_si512(hv, h2));
            const __m512i w3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n1, 4), lo4),
                                               _mm512_and_si512(_mm512_srli_epi16(hv, 2), h2));
            const __m512i s32 = pz_i8x16(b0 + 16 + 8 * j, b1 + 16 + 8 * j);
            const __m512i sp = _mm512_or_si512(_mm512_and_si512(s32, low16), _mm512_slli_epi32(s32, 16));
#define LS_PR(r, acc, yy)                                                                     \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 16 * j;                                              \
        acc = _mm512_dpwssd_epi32(acc, _mm512_add_epi16(_mm512_maddubs_epi16(w0, pz_bcast4(xr)), \
                                                        _mm512_maddubs_epi16(w1, pz_bcast4(xr + 4))), sp); \
        acc = _mm512_dpwssd_epi32(acc, _mm512_add_epi16(_mm512_maddubs_epi16(w2, pz_bcast4(xr + 8)), \
                                                        _mm512_maddubs_epi16(w3, pz_bcast4(xr + 12))), sp); \
    } while (0)
            PZ_EACH(LS_PR);
#undef LS_PR
        }
        // 32 * sum_j sc_j * bs16_j per row lane: sub-block pairs (sc_2k, sc_2k+1)
        __m512i mp[8];
        for (int k = 0; k < 8; k++) {
            const __m512i lo = pz_i8x16(b0 + 16 + 16 * k, b1 + 16 + 16 * k);
            const __m512i hi = pz_i8x16(b0 + 24 + 16 * k, b1 + 24 + 16 * k);
            mp[k] = _mm512_or_si512(_mm512_and_si512(lo, low16), _mm512_slli_epi32(hi, 16));
        }
        const __m512 d = pz_halves16(b0, b1);
#define LS_PF(r, acc, yy)                                                                     \
    do {                                                                                      \
        const int16_t *bs = bs16 + (r) * (K / 16) + 16 * b;                                    \
        __m512i ms = _mm512_madd_epi16(mp[0], _mm512_set1_epi32(*(const int32_t *)bs));        \
        for (int k = 1; k < 8; k++)                                                           \
            ms = _mm512_add_epi32(ms, _mm512_madd_epi16(mp[k], _mm512_set1_epi32(*(const int32_t *)(bs + 2 * k)))); \
        const __m512i is = _mm512_sub_epi32(acc, _mm512_slli_epi32(ms, 5));                   \
        const __m512 xs = _mm512_set1_ps(xd[(r) * nb + b]);                                    \
        yy = _mm512_add_ps(yy, _mm512_mul_ps(_mm512_mul_ps(d, xs), _mm512_cvtepi32_ps(is)));   \
    } while (0)
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
                        type == T_IQ4_NL || type == T_Q6_K);
}
