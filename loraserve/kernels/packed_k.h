// The packed K-quant kernel of Q4_K and Q5_K (layout and numbers: packed.h). Q5_K's group
// is Q4_K's (its scales, mins and low nibbles in the same places) and, after it, the fifth
// bits: hb[4 pairs g][2 sub-blocks 2g, 2g + 1][8 rows][4], bit t of byte 4 * row + i = the
// fifth bit of value 4t + i of the sub-block (1440 B a super-block); values 0..31, so the
// same integer sums and float steps as kquant.h's Q5_K rows read in place: the same bits.

#pragma once

#include "packed_steps.h"

// bytes of a packed Q4_K (q5 0) or Q5_K (q5 1) super-block of 8 rows
#define PK_K_BYTES(q5) ((q5) ? 1440 : 1184)

// 8 rows (group g) of packed Q4_K (q5 0) or Q5_K (q5 1; compile-time) against R (1..4)
// activation rows quantized per 256: x [R, K], xd [R, K/256], bs32 [R, K/32] (each 32
// values' sum): y[r * ldy + 0..7].
static inline __attribute__((always_inline)) void pk_dot_q4_k(
    const uint8_t *g, int q5, const int8_t *x, const float *xd, const int16_t *bs32, int64_t K,
    int R, int ahead, float *y, int64_t ldy) {
    const int64_t nb = K / 256, sb = PK_K_BYTES(q5);
#if defined(__AVX2__)
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    (void)b4;  // Q5_K's fifth bits only
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + sb * b;
        const int8_t *xb = x + 256 * b;
        __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
        for (int gp = 0; gp < 4; gp++) {
            __m256i l0 = _mm256_setzero_si256(), l1 = l0, l2 = l0, l3 = l0;
            __m256i h0 = l0, h1 = l0, h2 = l0, h3 = l0;
            const uint8_t *nib = blk + 160 + 256 * gp;
            const __m256i hl = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 1184 + 64 * gp)) : l0;
            const __m256i hh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 1216 + 64 * gp)) : l0;
            // int16 sums of 8 products pairs: at most 8 * 2 * 15 * 127 = 30480, exact (Q5_K:
            // 4 pairs, 4 * 2 * 31 * 127 = 31496, the sums taken every 4 steps); with AVX-512
            // VNNI int32 sums of the 4 products a step (dpbusd), the same integers once the
            // sub-block scale multiplies them (below)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_PR(r, lo, hi)                                                                      \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 64 * gp + 4 * t;                                     \
        lo = _mm256_dpbusd_epi32(lo, wl, pk_bcast4(xr));                                       \
        hi = _mm256_dpbusd_epi32(hi, wh, pk_bcast4(xr + 32));                                  \
    } while (0)
#else
#define LS_PR(r, lo, hi)                                                                      \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 64 * gp + 4 * t;                                     \
        lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(wl, pk_bcast4(xr)));                    \
        hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(wh, pk_bcast4(xr + 32)));               \
    } while (0)
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            // the 32-bit sums times each row's scale (one per lane): the int16 form's integers
            const __m256i sl = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 32 + 16 * gp)));
            const __m256i sh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 40 + 16 * gp)));
#define LS_PS(lo, hi, acc)                                                                    \
    acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_mullo_epi32(lo, sl), _mm256_mullo_epi32(hi, sh)))
#else
            const __m256i sl = pk_pair16(blk + 32 + 16 * gp), sh = pk_pair16(blk + 40 + 16 * gp);
#define LS_PS(lo, hi, acc)                                                                    \
    acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(lo, sl), _mm256_madd_epi16(hi, sh)))
#endif
#define LS_SUMS()                                                                             \
    do {                                                                                      \
        LS_PS(l0, h0, i0);                                                                    \
        if (R > 1) LS_PS(l1, h1, i1);                                                         \
        if (R > 2) LS_PS(l2, h2, i2);                                                         \
        if (R > 3) LS_PS(l3, h3, i3);                                                         \
    } while (0)
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                if (ahead) PREFETCH(blk + (sb / 4) * gp + (sb / 32) * t);
                const __m256i v = _mm256_loadu_si256((const __m256i *)(nib + 32 * t));
                __m256i wl = _mm256_and_si256(v, lo4);
                __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                if (q5) {  // bit t of each byte to bit 4 (16-bit shifts: the mask keeps the byte's own)
                    wl = _mm256_or_si256(wl, _mm256_and_si256(t <= 4 ? _mm256_slli_epi16(hl, 4 - t)
                                                                      : _mm256_srli_epi16(hl, t - 4), b4));
                    wh = _mm256_or_si256(wh, _mm256_and_si256(t <= 4 ? _mm256_slli_epi16(hh, 4 - t)
                                                                      : _mm256_srli_epi16(hh, t - 4), b4));
                }
                PK_EACH(LS_PR, l, h);
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
                if (q5 && t == 3) {  // the int16 sums of 4 steps into the int32 ones
                    LS_SUMS();
                    l0 = l1 = l2 = l3 = h0 = h1 = h2 = h3 = _mm256_setzero_si256();
                }
#endif
            }
#undef LS_PR
            LS_SUMS();
#undef LS_SUMS
#undef LS_PS
        }
        // sum_j mn_j * bs32_j: pairs of sub-blocks (mn_2i, mn_2i+1) per row lane
        __m256i mp[4];
        for (int i = 0; i < 4; i++)
            mp[i] = _mm256_or_si256(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 96 + 16 * i))),
                _mm256_slli_epi32(_mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)(blk + 104 + 16 * i))), 16));
        const __m256 d = pk_halves8(blk), dm = pk_halves8(blk + 16);
#define LS_PF(r, acc, yy)                                                                     \
    PK_SB_END(256, acc, yy, mp, 4, bs32 + (r) * (K / 32) + 8 * b, 0, 1, d, dm, xd[(r) * nb + b])
        PK_EACH(LS_PF, i, y);
#undef LS_PF
    }
    pk_store(y, ldy, R, y0, y1, y2, y3);
#else
    (void)ahead;
    for (int r = 0; r < R; r++)
        for (int l = 0; l < 8; l++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = g + sb * b;
                int32_t is = 0, ms = 0;
                for (int j = 0; j < 8; j++) {
                    int32_t s = 0;
                    for (int t = 0; t < 8; t++)
                        for (int i = 0; i < 4; i++) {
                            const uint8_t v = blk[160 + 256 * (j / 2) + 32 * t + 4 * l + i];
                            int w = j & 1 ? v >> 4 : v & 15;
                            if (q5) w |= ((blk[1184 + 32 * j + 4 * l + i] >> t) & 1) << 4;
                            s += w * x[r * K + 256 * b + 32 * j + 4 * t + i];
                        }
                    is += blk[32 + 8 * j + l] * s;
                    ms += blk[96 + 8 * j + l] * bs32[r * (K / 32) + 8 * b + j];
                }
                const float xs = xd[r * nb + b];
                acc = acc + (half_to_float(blk + 2 * l) * xs) * (float)is;
                acc = acc - (half_to_float(blk + 16 + 2 * l) * xs) * (float)ms;
            }
            y[r * ldy + l] = acc;
        }
#endif
}
