// The packed IQ4_NL kernel: Q4_0's packed layout (packed.h: f16 d[8] | nibbles[4 u][8 rows][4],
// low nibble = step u, high = step u + 4), each nibble an index into kvalues_iq4nl.
//
// Numbers: per block c, the exact integer isum_c = sum kv[q] * x, then y = isum_c * (dw_c *
// dx_c) + y (fused), as the other packed 32-value types. AVX2: |kv| and sign(x, kv) (the
// values are never 0) in maddubs, widened by madd (|kv| <= 127: no pair saturates). AVX-512
// VNNI: the table offset by 128 (1..241, unsigned) straight into dpbusd, less 128 * sum(x)
// once per block: the same integers, one instruction a step and row.

#pragma once

#include "packed.h"

// 8 rows (group g) of packed IQ4_NL against R (1..4, compile-time) activation rows x [R, K]
// with block scales xd [R, K/32] and sums bs [R, K/32]: y[r * ldy + 0..7].
static inline __attribute__((always_inline)) void pk_dot_iq4_nl(
    const uint8_t *g, const int8_t *x, const float *xd, const int16_t *bs, int64_t K, int R,
    int ahead, float *y, int64_t ldy) {
    const int64_t nc = K / 32;
#if defined(__AVX2__)
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    const __m128i kv128 = _mm_loadu_si128((const __m128i *)KV_IQ4NL);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    const __m256i kv = _mm256_broadcastsi128_si256(_mm_add_epi8(kv128, _mm_set1_epi8((char)0x80)));
    (void)bs;
#else
    const __m256i kv = _mm256_broadcastsi128_si256(kv128), ones = _mm256_set1_epi16(1);
#endif
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *blk = g + 144 * c, *nib = blk + 16;
        if (ahead) PREFETCH(blk), PREFETCH(blk + 64), PREFETCH(blk + 128);
        __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_PR(r, acc) acc = _mm256_dpbusd_epi32(acc, w, pk_bcast4(x + (r) * K + 32 * c + 4 * t))
#else
#define LS_PR(r, acc)                                                                         \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(                         \
                                    aw, _mm256_sign_epi8(pk_bcast4(x + (r) * K + 32 * c + 4 * t), w)), ones))
#endif
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(nib + 32 * (t & 3)));
            const __m256i w = _mm256_shuffle_epi8(
                kv, t < 4 ? _mm256_and_si256(v, lo4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4));
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
            const __m256i aw = _mm256_sign_epi8(w, w);
#endif
            LS_PR(0, i0);
            if (R > 1) LS_PR(1, i1);
            if (R > 2) LS_PR(2, i2);
            if (R > 3) LS_PR(3, i3);
        }
#undef LS_PR
        const __m256 dw = pk_halves8(blk);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_ISUM(r, acc) _mm256_sub_epi32(acc, _mm256_set1_epi32(128 * bs[(r) * nc + c]))
#else
#define LS_ISUM(r, acc) (acc)
#endif
#define LS_PF(r, acc, yy)                                                                     \
    yy = madd8(_mm256_cvtepi32_ps(LS_ISUM(r, acc)), _mm256_mul_ps(dw, _mm256_set1_ps(xd[(r) * nc + c])), yy)
        PK_EACH(LS_PF, i, y);
#undef LS_PF
#undef LS_ISUM
    }
    pk_store(y, ldy, R, y0, y1, y2, y3);
#else
    (void)ahead;
    (void)bs;
    for (int r = 0; r < R; r++)
        for (int l = 0; l < 8; l++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < nc; c++) {
                const uint8_t *blk = g + 144 * c, *nib = blk + 16;
                int32_t s = 0;
                for (int t = 0; t < 8; t++)
                    for (int i = 0; i < 4; i++) {
                        const uint8_t q = nib[32 * (t & 3) + 4 * l + i];
                        s += KV_IQ4NL[t < 4 ? q & 15 : q >> 4] * x[r * K + 32 * c + 4 * t + i];
                    }
                acc = madd1((float)s, half_to_float(blk + 2 * l) * xd[r * nc + c], acc);
            }
            y[r * ldy + l] = acc;
        }
#endif
}
