// The packed IQ4_XS kernel. Layout per group of 8 rows, per super-block of 256 values
// (1104 B): f16 d[8] | int8 sc[8 sub-blocks j][8 rows] (the 6-bit scale less 32) |
// nibbles[8 j][4 steps t][8 rows][4]: low = value 32 j + 4 t + i, high = the same + 16
// (the file's byte qs[16 j + 4 t + i] of the row), each nibble an index into kvalues_iq4nl.
//
// Numbers: per super-block the exact integer isum = sum_j sc_j * sum kv[q] x, then
// y = y + (d * dx) * isum, the float steps of kquant.h's IQ4_XS rows read in place: the same
// bits. AVX2: |kv| and sign(x, kv) in maddubs, times the scale in madd (per step: |pair| <=
// 32258, times 32 fits int32). AVX-512 VNNI: the table offset by 128 in dpbusd per
// sub-block, less 128 * sum(x), times the scale (mullo): the same integers.

#pragma once

#include "packed.h"

#define PK_XS_BYTES 1104

#if defined(__AVX2__)
// 8 signed bytes (one per row) as int32 lanes
static inline __m256i pk_i8x8(const uint8_t *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
#endif

// 8 rows (group g) of packed IQ4_XS against R (1..4) activation rows quantized per 256: x
// [R, K], xd [R, K/256], bs32 [R, K/32]: y[r * ldy + 0..7].
static inline __attribute__((always_inline)) void pk_dot_iq4_xs(
    const uint8_t *g, const int8_t *x, const float *xd, const int16_t *bs32, int64_t K, int R,
    int ahead, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
#if defined(__AVX2__)
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    const __m128i kv128 = _mm_loadu_si128((const __m128i *)KV_IQ4NL);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    const __m256i kv = _mm256_broadcastsi128_si256(_mm_add_epi8(kv128, _mm_set1_epi8((char)0x80)));
#else
    const __m256i kv = _mm256_broadcastsi128_si256(kv128);
#endif
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + PK_XS_BYTES * b;
        const int8_t *xb = x + 256 * b;
        __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *nib = blk + 80 + 128 * j;
            const __m256i sc = pk_i8x8(blk + 16 + 8 * j);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
#define LS_PR(r, acc, s)                                                                      \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 32 * j + 4 * t;                                      \
        s = _mm256_dpbusd_epi32(s, wl, pk_bcast4(xr));                                         \
        s = _mm256_dpbusd_epi32(s, wh, pk_bcast4(xr + 16));                                    \
    } while (0)
#else
            const __m256i sp = _mm256_blend_epi16(sc, _mm256_slli_epi32(sc, 16), 0xAA);  // (sc, sc)
#define LS_PR(r, acc, s)                                                                      \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 32 * j + 4 * t;                                      \
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(                    \
                                        awl, _mm256_sign_epi8(pk_bcast4(xr), wl)), sp));       \
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(                    \
                                        awh, _mm256_sign_epi8(pk_bcast4(xr + 16), wh)), sp));  \
    } while (0)
#endif
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                if (ahead) PREFETCH(nib + 32 * t);
                const __m256i v = _mm256_loadu_si256((const __m256i *)(nib + 32 * t));
                const __m256i wl = _mm256_shuffle_epi8(kv, _mm256_and_si256(v, lo4));
                const __m256i wh = _mm256_shuffle_epi8(kv, _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4));
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
                const __m256i awl = _mm256_sign_epi8(wl, wl), awh = _mm256_sign_epi8(wh, wh);
#endif
                LS_PR(0, i0, s0);
                if (R > 1) LS_PR(1, i1, s1);
                if (R > 2) LS_PR(2, i2, s2);
                if (R > 3) LS_PR(3, i3, s3);
            }
#undef LS_PR
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            // less the offset's 128 * sum(x) of the sub-block, times each row's scale
#define LS_PS(r, acc, s)                                                                      \
    acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(_mm256_sub_epi32(                           \
              s, _mm256_set1_epi32(128 * bs32[(r) * (K / 32) + 8 * b + j])), sc))
            LS_PS(0, i0, s0);
            if (R > 1) LS_PS(1, i1, s1);
            if (R > 2) LS_PS(2, i2, s2);
            if (R > 3) LS_PS(3, i3, s3);
#undef LS_PS
#endif
        }
        const __m256 d = pk_halves8(blk);
#define LS_PF(r, acc, yy)                                                                     \
    yy = _mm256_add_ps(yy, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(xd[(r) * nb + b])),   \
                                         _mm256_cvtepi32_ps(acc)))
        PK_EACH(LS_PF, i, y);
#undef LS_PF
    }
    pk_store(y, ldy, R, y0, y1, y2, y3);
#else
    (void)ahead;
    (void)bs32;
    for (int r = 0; r < R; r++)
        for (int l = 0; l < 8; l++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = g + PK_XS_BYTES * b;
                int32_t is = 0;
                for (int j = 0; j < 8; j++) {
                    int32_t s = 0;
                    for (int t = 0; t < 4; t++)
                        for (int i = 0; i < 4; i++) {
                            const uint8_t q = blk[80 + 128 * j + 32 * t + 4 * l + i];
                            const int8_t *xr = x + r * K + 256 * b + 32 * j + 4 * t + i;
                            s += KV_IQ4NL[q & 15] * xr[0] + KV_IQ4NL[q >> 4] * xr[16];
                        }
                    is += (int8_t)blk[16 + 8 * j + l] * s;
                }
                acc = acc + (half_to_float(blk + 2 * l) * xd[r * nb + b]) * (float)is;
            }
            y[r * ldy + l] = acc;
        }
#endif
}

// One group's super-block b of 8 rows (row r at rows + r * row_bytes) <-> its packed bytes;
// dir 1 packs, 0 writes the file's bytes back (exact).
static void pk_move_iq4_xs(uint8_t *rows, int64_t row_bytes, int64_t b, uint8_t *g, int dir) {
    uint8_t *blk = g + PK_XS_BYTES * b;
    for (int r = 0; r < PK_ROWS; r++) {
        uint8_t *src = rows + r * row_bytes + 136 * b;
        if (dir) {
            memcpy(blk + 2 * r, src, 2);
            uint16_t sh;
            memcpy(&sh, src + 2, 2);
            for (int j = 0; j < 8; j++) {
                const int ls = ((src[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4);
                blk[16 + 8 * j + r] = (uint8_t)(int8_t)(ls - 32);
            }
        } else {
            memcpy(src, blk + 2 * r, 2);
            uint16_t sh = 0;
            memset(src + 4, 0, 4);
            for (int j = 0; j < 8; j++) {
                const int ls = (int8_t)blk[16 + 8 * j + r] + 32;
                src[4 + j / 2] |= (uint8_t)((ls & 15) << (4 * (j % 2)));
                sh |= (uint16_t)((ls >> 4) << (2 * j));
            }
            memcpy(src + 2, &sh, 2);
        }
        for (int j = 0; j < 8; j++)
            for (int t = 0; t < 4; t++) {
                uint8_t *p = blk + 80 + 128 * j + 32 * t + 4 * r, *q = src + 8 + 16 * j + 4 * t;
                if (dir) memcpy(p, q, 4);
                else memcpy(q, p, 4);
            }
    }
}
