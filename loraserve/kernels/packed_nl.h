// The packed IQ4_NL and MXFP4 kernel: Q4_0's packed layout (packed.h: f16 d[8] | nibbles[4
// u][8 rows][4], low nibble = step u, high = step u + 4), each nibble an index into
// kvalues_iq4nl; MXFP4 (136 B a block) the same with the rows' 8 e8m0 exponent bytes in
// place of the f16 scales (u8 e[8] | nibbles) and kvalues_mxfp4 (values 0 .. +-12).
//
// Numbers: per block c, the exact integer isum_c = sum kv[q] * x, then y = isum_c * (dw_c *
// dx_c) + y (fused), as the other packed 32-value types (MXFP4's dw_c a power of two, the
// float e8m0_half gives). AVX2: |kv| and sign(x, kv) in maddubs (a 0 value: 0 * 0), widened
// by madd (|kv| <= 127: no pair saturates). AVX-512 VNNI: the table offset by 128
// (unsigned) straight into dpbusd, less 128 * sum(x) once per block: the same integers,
// one instruction a step and row.

#pragma once

#include "packed.h"

// the bytes of a packed block of 8 rows x 32 values: IQ4_NL (mx 0) or MXFP4 (mx 1)
#define PK_NL_BYTES(mx) ((mx) ? 136 : 144)

#if defined(__AVX2__)
// 8 e8m0 exponent bytes (one per row) as the floats e8m0_half gives (exact: 2^(e - 128),
// the two smallest as subnormals)
static inline __m256 pk_e8m0x8(const uint8_t *p) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}
#endif

// 8 rows (group g) of packed IQ4_NL (mx 0) or MXFP4 (mx 1; compile-time) against R (1..4,
// compile-time) activation rows x [R, K] with block scales xd [R, K/32] and sums bs
// [R, K/32]: y[r * ldy + 0..7].
static inline __attribute__((always_inline)) void pk_dot_iq4_nl(
    const uint8_t *g, int mx, const int8_t *x, const float *xd, const int16_t *bs, int64_t K,
    int R, int ahead, float *y, int64_t ldy) {
    const int64_t nc = K / 32, bb = PK_NL_BYTES(mx), hd = bb - 128;
#if defined(__AVX2__)
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    const __m128i kv128 = _mm_loadu_si128((const __m128i *)(mx ? KV_MXFP4 : KV_IQ4NL));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    const __m256i kv = _mm256_broadcastsi128_si256(_mm_add_epi8(kv128, _mm_set1_epi8((char)0x80)));
    (void)bs;
#else
    const __m256i kv = _mm256_broadcastsi128_si256(kv128), ones = _mm256_set1_epi16(1);
#endif
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *blk = g + bb * c, *nib = blk + hd;
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
        const __m256 dw = mx ? pk_e8m0x8(blk) : pk_halves8(blk);
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
                const uint8_t *blk = g + bb * c, *nib = blk + hd;
                const int8_t *kv = mx ? KV_MXFP4 : KV_IQ4NL;
                int32_t s = 0;
                for (int t = 0; t < 8; t++)
                    for (int i = 0; i < 4; i++) {
                        const uint8_t q = nib[32 * (t & 3) + 4 * l + i];
                        s += kv[t < 4 ? q & 15 : q >> 4] * x[r * K + 32 * c + 4 * t + i];
                    }
                const float dw = mx ? e8m0_half(blk[l]) : half_to_float(blk + 2 * l);
                acc = madd1((float)s, dw * xd[r * nc + c], acc);
            }
            y[r * ldy + l] = acc;
        }
#endif
}
