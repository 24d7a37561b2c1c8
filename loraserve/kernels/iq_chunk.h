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

// KSIGNS_IQ2XS[i]'s 8 sign bits as bytes, -1 where a bit is set and +1 elsewhere (what
// iq_signs32 makes of them), one 64-bit word per 7-bit index: a sign index is one load
static const uint64_t KSIGNS64[128] = {
    0x0101010101010101ULL, 0xFF010101010101FFULL, 0xFF0101010101FF01ULL, 0x010101010101FFFFULL,
    0xFF01010101FF0101ULL, 0x0101010101FF01FFULL, 0x0101010101FFFF01ULL, 0xFF01010101FFFFFFULL,
    0xFF010101FF010101ULL, 0x01010101FF0101FFULL, 0x01010101FF01FF01ULL, 0xFF010101FF01FFFFULL,
    0x01010101FFFF0101ULL, 0xFF010101FFFF01FFULL, 0xFF010101FFFFFF01ULL, 0x01010101FFFFFFFFULL,
    0xFF0101FF01010101ULL, 0x010101FF010101FFULL, 0x010101FF0101FF01ULL, 0xFF0101FF0101FFFFULL,
    0x010101FF01FF0101ULL, 0xFF0101FF01FF01FFULL, 0xFF0101FF01FFFF01ULL, 0x010101FF01FFFFFFULL,
    0x010101FFFF010101ULL, 0xFF0101FFFF0101FFULL, 0xFF0101FFFF01FF01ULL, 0x010101FFFF01FFFFULL,
    0xFF0101FFFFFF0101ULL, 0x010101FFFFFF01FFULL, 0x010101FFFFFFFF01ULL, 0xFF0101FFFFFFFFFFULL,
    0xFF01FF0101010101ULL, 0x0101FF01010101FFULL, 0x0101FF010101FF01ULL, 0xFF01FF010101FFFFULL,
    0x0101FF0101FF0101ULL, 0xFF01FF0101FF01FFULL, 0xFF01FF0101FFFF01ULL, 0x0101FF0101FFFFFFULL,
    0x0101FF01FF010101ULL, 0xFF01FF01FF0101FFULL, 0xFF01FF01FF01FF01ULL, 0x0101FF01FF01FFFFULL,
    0xFF01FF01FFFF0101ULL, 0x0101FF01FFFF01FFULL, 0x0101FF01FFFFFF01ULL, 0xFF01FF01FFFFFFFFULL,
    0x0101FFFF01010101ULL, 0xFF01FFFF010101FFULL, 0xFF01FFFF0101FF01ULL, 0x0101FFFF0101FFFFULL,
    0xFF01FFFF01FF0101ULL, 0x0101FFFF01FF01FFULL, 0x0101FFFF01FFFF01ULL, 0xFF01FFFF01FFFFFFULL,
    0xFF01FFFFFF010101ULL, 0x0101FFFFFF0101FFULL, 0x0101FFFFFF01FF01ULL, 0xFF01FFFFFF01FFFFULL,
    0x0101FFFFFFFF0101ULL, 0xFF01FFFFFFFF01FFULL, 0xFF01FFFFFFFFFF01ULL, 0x0101FFFFFFFFFFFFULL,
    0xFFFF010101010101ULL, 0x01FF0101010101FFULL, 0x01FF01010101FF01ULL, 0xFFFF01010101FFFFULL,
    0x01FF010101FF0101ULL, 0xFFFF010101FF01FFULL, 0xFFFF010101FFFF01ULL, 0x01FF010101FFFFFFULL,
    0x01FF0101FF010101ULL, 0xFFFF0101FF0101FFULL, 0xFFFF0101FF01FF01ULL, 0x01FF0101FF01FFFFULL,
    0xFFFF0101FFFF0101ULL, 0x01FF0101FFFF01FFULL, 0x01FF0101FFFFFF01ULL, 0xFFFF0101FFFFFFFFULL,
    0x01FF01FF01010101ULL, 0xFFFF01FF010101FFULL, 0xFFFF01FF0101FF01ULL, 0x01FF01FF0101FFFFULL,
    0xFFFF01FF01FF0101ULL, 0x01FF01FF01FF01FFULL, 0x01FF01FF01FFFF01ULL, 0xFFFF01FF01FFFFFFULL,
    0xFFFF01FFFF010101ULL, 0x01FF01FFFF0101FFULL, 0x01FF01FFFF01FF01ULL, 0xFFFF01FFFF01FFFFULL,
    0x01FF01FFFFFF0101ULL, 0xFFFF01FFFFFF01FFULL, 0xFFFF01FFFFFFFF01ULL, 0x01FF01FFFFFFFFFFULL,
    0x01FFFF0101010101ULL, 0xFFFFFF01010101FFULL, 0xFFFFFF010101FF01ULL, 0x01FFFF010101FFFFULL,
    0xFFFFFF0101FF0101ULL, 0x01FFFF0101FF01FFULL, 0x01FFFF0101FFFF01ULL, 0xFFFFFF0101FFFFFFULL,
    0xFFFFFF01FF010101ULL, 0x01FFFF01FF0101FFULL, 0x01FFFF01FF01FF01ULL, 0xFFFFFF01FF01FFFFULL,
    0x01FFFF01FFFF0101ULL, 0xFFFFFF01FFFF01FFULL, 0xFFFFFF01FFFFFF01ULL, 0x01FFFF01FFFFFFFFULL,
    0xFFFFFFFF01010101ULL, 0x01FFFFFF010101FFULL, 0x01FFFFFF0101FF01ULL, 0xFFFFFFFF0101FFFFULL,
    0x01FFFFFF01FF0101ULL, 0xFFFFFFFF01FF01FFULL, 0xFFFFFFFF01FFFF01ULL, 0x01FFFFFF01FFFFFFULL,
    0x01FFFFFFFF010101ULL, 0xFFFFFFFFFF0101FFULL, 0xFFFFFFFFFF01FF01ULL, 0x01FFFFFFFF01FFFFULL,
    0xFFFFFFFFFFFF0101ULL, 0x01FFFFFFFFFF01FFULL, 0x01FFFFFFFFFFFF01ULL, 0xFFFFFFFFFFFFFFFFULL,
};

// four 7-bit sign indices of s (bits 7 l ..) as iq_signs32's bytes: four loads of KSIGNS64
// (in place of four byte lookups, their shifts into one word and its expansion: 13 fewer
// operations a 32-value chunk)
static inline __m256i iq_ksigns4v(uint32_t s) {
    return _mm256_set_epi64x((long long)KSIGNS64[(s >> 21) & 127], (long long)KSIGNS64[(s >> 14) & 127],
                             (long long)KSIGNS64[(s >> 7) & 127], (long long)KSIGNS64[s & 127]);
}

// The 16 integer scales iq_k_scales writes (as int16, sub-block order) and in *d its float
// scale, in a few vector operations
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
    case T_IQ1_M: {  // scale k: bits 3 (k % 4) .. + 2 of word k / 4 at x + 48, by a multiply
        // that puts them at bits 13..15 (AVX2 has no per-lane 16-bit shift)
        const __m256i w = _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)(x + 48))),
            _mm256_set_epi8(7, 6, 7, 6, 7, 6, 7, 6, 5, 4, 5, 4, 5, 4, 5, 4, 3, 2, 3, 2, 3, 2, 3, 2, 1, 0, 1, 0, 1, 0, 1, 0));
        const __m256i t = _mm256_srli_epi16(
            _mm256_mullo_epi16(w, _mm256_set_epi16(16, 128, 1024, 8192, 16, 128, 1024, 8192, 16, 128, 1024, 8192,
                                                   16, 128, 1024, 8192)), 13);
        *d = iq1m_d(x) * 0.125f;
        return _mm256_add_epi16(_mm256_add_epi16(t, t), _mm256_set1_epi16(1));
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

#if defined(__BMI2__)
// The 4 grid indices of a 32-value chunk, a[i] | (the i-th field of h's bits at hm) as 16-bit
// fields of one word: two bit deposits (ggml's AVX2 IQ1 kernels do the same) in place of
// four shift-mask-or chains
static inline uint64_t iq_idx4(const uint8_t *a, uint32_t h, uint64_t hm) {
    return _pdep_u64(iq_u32(a), 0x00FF00FF00FF00FFULL) | _pdep_u64(h, hm);
}
#define LS_IX(ix, i) (((ix) >> (16 * (i))) & 0xFFFF)
#endif

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
        *sg = iq_ksigns4v(iq_u32(a + 4));
        return LS_G64(IQ2XXS_GRID, a[0], a[1], a[2], a[3]);
    }
    case T_IQ2_XS: {
        const uint8_t *a = x + 2 + 8 * ib;
        const uint16_t v0 = iq_u16(a), v1 = iq_u16(a + 2), v2 = iq_u16(a + 4), v3 = iq_u16(a + 6);
        *sg = _mm256_set_epi64x((long long)KSIGNS64[v3 >> 9], (long long)KSIGNS64[v2 >> 9],
                                (long long)KSIGNS64[v1 >> 9], (long long)KSIGNS64[v0 >> 9]);
        return LS_G64(IQ2XS_GRID, v0 & 511, v1 & 511, v2 & 511, v3 & 511);
    }
    case T_IQ2_S: {
        const uint8_t *a = x + 2 + 4 * ib;
        const int h = x[66 + ib];
        *sg = iq_signs32(iq_u32(x + 34 + 4 * ib));
#if defined(__BMI2__)
        const uint64_t ix = iq_idx4(a, (uint32_t)h, 0x0300030003000300ULL);
        return LS_G64(IQ2S_GRID, LS_IX(ix, 0), LS_IX(ix, 1), LS_IX(ix, 2), LS_IX(ix, 3));
#else
        return LS_G64(IQ2S_GRID, a[0] | ((h << 8) & 0x300), a[1] | ((h << 6) & 0x300),
                      a[2] | ((h << 4) & 0x300), a[3] | ((h << 2) & 0x300));
#endif
    }
    case T_IQ3_XXS: {
        const uint8_t *a = x + 2 + 8 * ib;
        *sg = iq_ksigns4v(iq_u32(x + 66 + 4 * ib));
        return _mm256_set_epi32((int)IQ3XXS_GRID[a[7]], (int)IQ3XXS_GRID[a[6]], (int)IQ3XXS_GRID[a[5]],
                                (int)IQ3XXS_GRID[a[4]], (int)IQ3XXS_GRID[a[3]], (int)IQ3XXS_GRID[a[2]],
                                (int)IQ3XXS_GRID[a[1]], (int)IQ3XXS_GRID[a[0]]);
    }
    case T_IQ3_S: {  // the 8 grid indices a[i] | (bit i of h) << 8 formed in one vector
        const uint8_t *a = x + 2 + 8 * ib;
        const __m256i hb = _mm256_and_si256(
            _mm256_sllv_epi32(_mm256_set1_epi32(x[66 + ib]), _mm256_set_epi32(1, 2, 3, 4, 5, 6, 7, 8)),
            _mm256_set1_epi32(256));
        uint32_t ix[8];
        _mm256_storeu_si256((__m256i *)ix, _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)a)), hb));
        *sg = iq_signs32(iq_u32(x + 74 + 4 * ib));
#define LS_I(i) (int)IQ3S_GRID[ix[i]]
        return _mm256_set_epi32(LS_I(7), LS_I(6), LS_I(5), LS_I(4), LS_I(3), LS_I(2), LS_I(1), LS_I(0));
#undef LS_I
    }
    case T_IQ1_S: {
        const uint16_t qh = iq_u16(x + 34 + 2 * ib);
        const uint8_t *a = x + 2 + 4 * ib;
#if defined(__BMI2__)
        const uint64_t ix = iq_idx4(a, qh, 0x0700070007000700ULL);
        const __m256i g = LS_G64(IQ1S_GRID, LS_IX(ix, 0), LS_IX(ix, 1), LS_IX(ix, 2), LS_IX(ix, 3));
#else
        const __m256i g = LS_G64(IQ1S_GRID, a[0] | ((qh << 8) & 0x700), a[1] | ((qh << 5) & 0x700),
                                 a[2] | ((qh << 2) & 0x700), a[3] | ((qh >> 1) & 0x700));
#endif
        const __m256i w = iq1_vals(g, _mm256_set1_epi8(qh & 0x8000 ? -1 : 1));
        *sg = w;
        return _mm256_abs_epi8(w);
    }
    default: {  // IQ1_M: qh nibble per 8 values: 3 index bits, then the delta's sign
        const uint8_t *a = x + 4 * ib;
#if defined(__BMI2__)
        const uint32_t h = iq_u16(x + 32 + 2 * ib);  // h0 | h1 << 8
        const uint64_t ix = iq_idx4(a, h & 0x7777, 0x0F000F000F000F00ULL);
        // the 4 sign bits to bit 7 of 4 bytes, widened: -1 (set) or 0, then | 1 per byte
        const __m256i sx = _mm256_cvtepi8_epi64(_mm_cvtsi32_si128((int)_pdep_u32(h & 0x8888, 0xF0F0F0F0u)));
        const __m256i w = iq1_vals(LS_G64(IQ1S_GRID, LS_IX(ix, 0), LS_IX(ix, 1), LS_IX(ix, 2), LS_IX(ix, 3)),
                                   _mm256_or_si256(_mm256_cmpgt_epi64(_mm256_setzero_si256(), sx),
                                                   _mm256_set1_epi8(1)));
#else
        const int h0 = x[32 + 2 * ib], h1 = x[33 + 2 * ib];
#define LS_D(h) ((h) & 8 ? -1LL : 0x0101010101010101LL)
        const __m256i w = iq1_vals(LS_G64(IQ1S_GRID, a[0] | ((h0 << 8) & 0x700), a[1] | ((h0 << 4) & 0x700),
                                          a[2] | ((h1 << 8) & 0x700), a[3] | ((h1 << 4) & 0x700)),
                                   _mm256_set_epi64x(LS_D(h1 >> 4), LS_D(h1), LS_D(h0 >> 4), LS_D(h0)));
#undef LS_D
#endif
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

// the bytes v times 3^n mod 256 (n 0..4) in 8-bit adds: 3 v = v + v + v, 9 v = (v << 3) + v
static inline __m256i tq1_pow3(__m256i v, int n) {
    if (n & 1) v = _mm256_add_epi8(v, _mm256_add_epi8(v, v));
    for (int i = 0; i < n / 2; i++)
        v = _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16(v, 3), _mm256_set1_epi8((char)0xF8)), v);
    return v;
}

// (m * 3) >> 8 of the bytes m, as tq1_trits' last step, without a multiply: with s = m - 1
// (saturated), (s + (s + 1) / 2 + 1) / 2 >> 6 (avg rounds up) -- equal for all 256 bytes
// (checked exhaustively; ggml's AVX2 TQ1_0 kernel takes the same steps)
static inline __m256i tq1_top2(__m256i m) {
    const __m256i s = _mm256_subs_epu8(m, _mm256_set1_epi8(1));
    return _mm256_and_si256(_mm256_srli_epi16(_mm256_avg_epu8(s, _mm256_avg_epu8(s, _mm256_setzero_si256())), 6),
                            _mm256_set1_epi8(3));
}

// Chunk j (values 32 j ..) of TQ1_0 super-block x, in place: its trits t = q + 1 (quant_nl.h
// unpack_nl_k's order: 32 bytes x 5 powers, then 16 bytes x 5, then 4 bytes x 4)
static inline __attribute__((always_inline)) __m256i tq1_chunk_u(const uint8_t *x, int j) {
    if (j < 5) return tq1_top2(tq1_pow3(_mm256_loadu_si256((const __m256i *)x), j));
    const __m128i c = _mm_loadu_si128((const __m128i *)(x + 32));
    if (j < 7) {  // values 160 + 16 n + i: byte 32 + i at 3^n, n = 2 (j - 5) and the next
        const __m256i cc = _mm256_broadcastsi128_si256(c);
        return tq1_top2(_mm256_permute2x128_si256(tq1_pow3(cc, 2 * j - 10), tq1_pow3(cc, 2 * j - 9), 0x30));
    }
    // values 224 .. 239 (n = 4), then 240 + 4 n + i: byte 48 + i at 3^n
    const __m128i t = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)iq_u32(x + 48)), _mm_set1_epi32(0x03020100));
    return tq1_trits(_mm256_set_m128i(t, c), _mm256_set_m128i(_mm_set_epi16(27, 27, 9, 9, 3, 3, 1, 1),
                                                              _mm_set1_epi16(81)));
}
#endif
