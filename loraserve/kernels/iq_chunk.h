// The grid types read in place, 32 values at a time (kquant.h's kdot): a sub-block's
// magnitudes and signs, and a super-block's 16 integer scales, the very numbers of
// quant_iq.h's scalar unpacking (iq_values, iq_k_scales); and TQ1_0's trits.

#pragma once

#include "quant_iq.h"

#if defined(__AVX2__)
// 32 sign bits s (bit i: value i) as bytes +-1 (-1 where the bit is set)
static inline __m256i iq_signs32(uint32_t s) {
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(1));
}

// four 7-bit sign indices of s (bits 7 l ..) through KSIGNS_IQ2XS, as 32 sign bits
static inline uint32_t iq_ksigns4(uint32_t s) {
    return (uint32_t)KSIGNS_IQ2XS[s & 127] | (uint32_t)KSIGNS_IQ2XS[(s >> 7) & 127] << 8 |
           (uint32_t)KSIGNS_IQ2XS[(s >> 14) & 127] << 16 | (uint32_t)KSIGNS_IQ2XS[(s >> 21) & 127] << 24;
}

// The 16 integer scales iq_k_scales writes (as int16, sub-block order) and in *d its float
// scale, in a few vector operations (IQ1_M: its scalar loop)
static inline __m256i iq_scales16(int type, const uint8_t *x, float *d) {
    const __m256i one = _mm256_set1_epi32(1);
    __m256i v;  // 8 int32 field values, one per 32-value sub-block, each scale 2 v + 1
    switch (type) {
    case T_IQ2_XXS: {  // the top nibbles of the second word of each 8-byte group
        const __m256 lo = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(x + 2)));
        const __m256 hi = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(x + 34)));
        v = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8);
        v = _mm256_srli_epi32(v, 28);
        break;
    }
    case T_IQ3_XXS: v = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(x + 66)), 28); break;
    case T_IQ1_S:
        v = _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + 34))), 12),
                             _mm256_set1_epi32(7));
        break;
    case T_IQ2_XS: case T_IQ2_S: {  // low nibble: the first 16 values, high: the second
        const __m128i s = _mm_loadl_epi64((const __m128i *)(x + (type == T_IQ2_XS ? 66 : 74)));
        const __m128i m15 = _mm_set1_epi8(15);
        const __m256i w = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(s, m15),
                                                                 _mm_and_si128(_mm_srli_epi16(s, 4), m15)));
        *d = half_to_float(x) * 0.125f;
        return _mm256_add_epi16(_mm256_add_epi16(w, w), _mm256_set1_epi16(1));
    }
    case T_IQ3_S: {  // a nibble per sub-block, low nibbles first
        const __m128i s = _mm_cvtsi32_si128((int)iq_u32(x + 106)), m15 = _mm_set1_epi8(15);
        v = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_and_si128(s, m15), _mm_and_si128(_mm_srli_epi16(s, 4), m15)));
        break;
    }
    default: {
        int16_t t16[16];
        *d = iq_k_scales(type, x, t16);
        return _mm256_loadu_si256((const __m256i *)t16);
    }
    }
    v = _mm256_add_epi32(_mm256_add_epi32(v, v), one);
    *d = type == T_IQ3_XXS ? half_to_float(x) * 0.25f : type == T_IQ3_S ? half_to_float(x)
                                                                          : half_to_float(x) * 0.125f;
    return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));  // each scale for both its halves
}

// IQ1 values 8 g + delta per 8 (g: an iq1s_grid entry's bytes -1/0/1; dl: delta bytes)
static inline __m256i iq1_vals(__m256i g, __m256i dl) {
    return _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16(g, 3), _mm256_set1_epi8((char)0xF8)), dl);
}

// Sub-block ib (values 32 ib .. 32 ib + 31) of super-block x of a grid type, in place: the
// magnitudes u >= 0 of the values iq_values writes, and in *sg their signs (bytes whose
// sign is the value's, never 0), so q = u * sign(sg): the kernels take sign(x, sg) * u,
// the same exact integers. The grid entries are read as ggml's AVX2 kernels read them
// (scalar loads into one vector), the signs expanded 32 at a time.
static inline __attribute__((always_inline)) __m256i iq_chunk(int type, const uint8_t *x, int ib,
                                                               __m256i *sg) {
#define LS_G64(t, a, b, c, d) _mm256_set_epi64x((long long)t[d], (long long)t[c], (long long)t[b], (long long)t[a])
    switch (type) {
    case T_IQ2_XXS: {
        const uint8_t *a = x + 2 + 8 * ib;
        *sg = iq_signs32(iq_ksigns4(iq_u32(a + 4)));
        return LS_G64(IQ2XXS_GRID, a[0], a[1], a[2], a[3]);
    }
    case T_IQ2_XS: {
        const uint8_t *a = x + 2 + 8 * ib;
        const uint16_t v0 = iq_u16(a), v1 = iq_u16(a + 2), v2 = iq_u16(a + 4), v3 = iq_u16(a + 6);
        *sg = iq_signs32((uint32_t)KSIGNS_IQ2XS[v0 >> 9] | (uint32_t)KSIGNS_IQ2XS[v1 >> 9] << 8 |
                         (uint32_t)KSIGNS_IQ2XS[v2 >> 9] << 16 | (uint32_t)KSIGNS_IQ2XS[v3 >> 9] << 24);
        return LS_G64(IQ2XS_GRID, v0 & 511, v1 & 511, v2 & 511, v3 & 511);
    }
    case T_IQ2_S: {
        const uint8_t *a = x + 2 + 4 * ib;
        const int h = x[66 + ib];
        *sg = iq_signs32(iq_u32(x + 34 + 4 * ib));
        return LS_G64(IQ2S_GRID, a[0] | ((h << 8) & 0x300), a[1] | ((h << 6) & 0x300),
                      a[2] | ((h << 4) & 0x300), a[3] | ((h << 2) & 0x300));
    }
    case T_IQ3_XXS: {
        const uint8_t *a = x + 2 + 8 * ib;
        *sg = iq_signs32(iq_ksigns4(iq_u32(x + 66 + 4 * ib)));
        return _mm256_set_epi32((int)IQ3XXS_GRID[a[7]], (int)IQ3XXS_GRID[a[6]], (int)IQ3XXS_GRID[a[5]],
                                (int)IQ3XXS_GRID[a[4]], (int)IQ3XXS_GRID[a[3]], (int)IQ3XXS_GRID[a[2]],
                                (int)IQ3XXS_GRID[a[1]], (int)IQ3XXS_GRID[a[0]]);
    }
    case T_IQ3_S: {
        const uint8_t *a = x + 2 + 8 * ib;
        const int h = x[66 + ib];
        *sg = iq_signs32(iq_u32(x + 74 + 4 * ib));
#define LS_I(i) (int)IQ3S_GRID[a[i] | ((h << (8 - (i))) & 256)]
        return _mm256_set_epi32(LS_I(7), LS_I(6), LS_I(5), LS_I(4), LS_I(3), LS_I(2), LS_I(1), LS_I(0));
#undef LS_I
    }
    case T_IQ1_S: {
        const uint16_t qh = iq_u16(x + 34 + 2 * ib);
        const uint8_t *a = x + 2 + 4 * ib;
        const __m256i w = iq1_vals(LS_G64(IQ1S_GRID, a[0] | ((qh << 8) & 0x700), a[1] | ((qh << 5) & 0x700),
                                          a[2] | ((qh << 2) & 0x700), a[3] | ((qh >> 1) & 0x700)),
                                   _mm256_set1_epi8(qh & 0x8000 ? -1 : 1));
        *sg = w;
        return _mm256_abs_epi8(w);
    }
    default: {  // IQ1_M: qh nibble per 8 values: 3 index bits, then the delta's sign
        const uint8_t *a = x + 4 * ib;
        const int h0 = x[32 + 2 * ib], h1 = x[33 + 2 * ib];
#define LS_D(h) ((h) & 8 ? -1LL : 0x0101010101010101LL)
        const __m256i w = iq1_vals(LS_G64(IQ1S_GRID, a[0] | ((h0 << 8) & 0x700), a[1] | ((h0 << 4) & 0x700),
                                          a[2] | ((h1 << 8) & 0x700), a[3] | ((h1 << 4) & 0x700)),
                                   _mm256_set_epi64x(LS_D(h1 >> 4), LS_D(h1), LS_D(h0 >> 4), LS_D(h0)));
#undef LS_D
        *sg = w;
        return _mm256_abs_epi8(w);
    }
    }
#undef LS_G64
}

// TQ1_0's trits t (0..2, the value t - 1) of the bytes v at the powers of 3 in pp (one per
// 16-bit lane): ((v * p mod 256) * 3) >> 8, as quant_nl.h's trit
static inline __m256i tq1_trits(__m256i v, __m256i pp) {
    const __m256i three = _mm256_set1_epi16(3), lo8 = _mm256_set1_epi16(0xFF);
    const __m256i e = _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(v, lo8), pp), lo8);
    const __m256i o = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(v, 8), pp), lo8);
    return _mm256_or_si256(_mm256_srli_epi16(_mm256_mullo_epi16(e, three), 8),
                           _mm256_slli_epi16(_mm256_srli_epi16(_mm256_mullo_epi16(o, three), 8), 8));
}

// Chunk j (values 32 j ..) of TQ1_0 super-block x, in place: its trits t = q + 1 (quant_nl.h
// unpack_nl_k's order: 32 bytes x 5 powers, then 16 bytes x 5, then 4 bytes x 4)
static inline __attribute__((always_inline)) __m256i tq1_chunk_u(const uint8_t *x, int j) {
    static const short P3[5] = {1, 3, 9, 27, 81};
    if (j < 5) return tq1_trits(_mm256_loadu_si256((const __m256i *)x), _mm256_set1_epi16(P3[j]));
    const __m128i c = _mm_loadu_si128((const __m128i *)(x + 32));
    if (j < 7)  // values 160 + 16 n + i: byte 32 + i at 3^n, n = 2 (j - 5) and the next
        return tq1_trits(_mm256_broadcastsi128_si256(c),
                         _mm256_set_m128i(_mm_set1_epi16(P3[2 * j - 9]), _mm_set1_epi16(P3[2 * j - 10])));
    // values 224 .. 239 (n = 4), then 240 + 4 n + i: byte 48 + i at 3^n
    const __m128i t = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)iq_u32(x + 48)), _mm_set1_epi32(0x03020100));
    return tq1_trits(_mm256_set_m128i(t, c), _mm256_set_m128i(_mm_set_epi16(27, 27, 9, 9, 3, 3, 1, 1),
                                                              _mm_set1_epi16(81)));
}
#endif
