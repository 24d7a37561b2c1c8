// The small pieces of kquant.h's K-form dot products: the offsets of the values read
// unsigned, the super-block sizes read in place, exact integer lane sums and the shuffle
// controls that spread a chunk's scales over its products.

#pragma once

#include "quant_chunk.h"

// the offset o of the unsigned values u = q + o that kdot reads in place (0: none)
#define K_OFF(t) ((t) == T_Q6_K || (t) == T_BUF6 ? 32 : (t) == T_Q3_K ? 4 : (t) == T_TQ2_0 || (t) == T_TQ1_0 ? 1 : 0)

// bytes per super-block of a type kdot reads in place (T_BUF6: Q6_K's, whose scales it
// reads from the row; 0: T_BUF)
static inline int k_block_bytes(int type) {
    int64_t block;
    return type == T_BUF6 ? 210 : type < 0 ? 0 : type == T_Q2_K ? 84 : type == T_Q3_K ? 110 : type == T_Q4_K ? 144
           : type == T_Q5_K ? 176 : type == T_Q6_K ? 210 : (int)nl_block_bytes(type, &block);
}

// the grid types kdot decodes in place (iq_chunk.h)
#define K_GRID(t) (iq_block_bytes(t) > 0)

#if defined(__AVX2__)
static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// The lane sums of 4 vectors, as the 4 lanes of one (exact, like hsum_i32 of each): each
// 128-bit half's sums by two 256-bit pair-adds, then the halves added
static inline __m128i hsum4_i32(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
#endif

// sum_j mn[j] * bs[j] over the 16 sub-blocks of one super-block (exact)
static inline int32_t k_msum(const int16_t *mn, const int16_t *bs) {
#if defined(__AVX2__)
    return hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)mn),
                                      _mm256_loadu_si256((const __m256i *)bs)));
#else
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += (int32_t)mn[j] * bs[j];
    return s;
#endif
}

#if defined(__AVX2__)
// shuffle controls that spread one chunk's scales over its 16 int16 products (pairs):
// KSH32[j]: scale j of 8 (both 128-bit lanes); KSH16[j]: scales 2j (low lane) and 2j + 1
// (high lane) of the 8 held in each lane
#define LS_B2(a) (int8_t)(a), (int8_t)((a) + 1)
#define LS_B16(a) LS_B2(a), LS_B2(a), LS_B2(a), LS_B2(a), LS_B2(a), LS_B2(a), LS_B2(a), LS_B2(a)
static const int8_t KSH32[8][32] __attribute__((aligned(32))) = {
    {LS_B16(0), LS_B16(0)}, {LS_B16(2), LS_B16(2)}, {LS_B16(4), LS_B16(4)},
    {LS_B16(6), LS_B16(6)}, {LS_B16(8), LS_B16(8)}, {LS_B16(10), LS_B16(10)},
    {LS_B16(12), LS_B16(12)}, {LS_B16(14), LS_B16(14)}};
static const int8_t KSH16[4][32] __attribute__((aligned(32))) = {
    {LS_B16(0), LS_B16(2)}, {LS_B16(4), LS_B16(6)}, {LS_B16(8), LS_B16(10)},
    {LS_B16(12), LS_B16(14)}};
#undef LS_B16
#undef LS_B2
#endif
