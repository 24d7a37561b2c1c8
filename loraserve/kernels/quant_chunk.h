// How the kernels read a weight row's values 32 at a time: the type tags of the values read
// from a buffer, which types keep one scale per 32 values, and the in-place decode of a chunk
// (chunk_values) and of a whole row once (decode_values): the numbers the unpackers write.

#pragma once

#include "quant_blocks.h"
#include "simd.h"

#define T_BUF (-1)  // values from the unpack buffer
#define T_BUFU (-2)  // values decoded into the buffer by decode_values, one scale per 32
#define T_BUF6 (-3)  // Q6_K's unsigned values u = q + 32 decoded into the buffer
// types whose scale is one per 32 values (both halves of a chunk equal): the scale vector
// is one broadcast (the same numbers as the two-half form, fewer instructions)
#define UNIFORM(t)                                                                            \
    ((t) == T_Q8_0 || (t) == T_Q4_0 || (t) == T_Q5_0 || (t) == T_IQ4_NL || (t) == T_MXFP4 ||    \
     (t) == T_BUFU)

// bytes per 32 values of the types decoded in place by chunk_values (0: values from a buffer)
#define CHUNK_BYTES(t)                                                                        \
    ((t) == T_Q8_0 ? 34 : (t) == T_Q4_0 || (t) == T_IQ4_NL ? 18 : (t) == T_Q5_0 ? 22          \
     : (t) == T_MXFP4 ? 17 : 0)

// the float scale of chunk c of a row decoded in place (an f16 at the block's start;
// MXFP4's e8m0 exponent byte)
static inline float chunk_scale(int type, const uint8_t *r, int64_t c) {
    return type == T_MXFP4 ? e8m0_half(r[17 * c]) : half_to_float(r + CHUNK_BYTES(type) * c);
}

#if defined(__AVX2__)
// The 32 int8 values of chunk c of a row (the same numbers the unpack functions write).
static inline __attribute__((always_inline)) __m256i chunk_values(int type, const uint8_t *r,
                                                                   const int8_t *qbuf, int64_t c) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    switch (type) {
    case T_Q8_0:
        return _mm256_loadu_si256((const __m256i *)(r + 34 * c + 2));
    case T_Q4_0: {
        __m128i t = _mm_loadu_si128((const __m128i *)(r + 18 * c + 2));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), lo4);
        return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    }
    case T_IQ4_NL: {  // Q4_0's layout, the nibbles through kvalues_iq4nl (one shuffle)
        __m128i t = _mm_loadu_si128((const __m128i *)(r + 18 * c + 2));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), lo4);
        const __m128i kv = _mm_loadu_si128((const __m128i *)KV_IQ4NL);
        return _mm256_shuffle_epi8(_mm256_set_m128i(kv, kv), v);
    }
    case T_MXFP4: {  // IQ4_NL's nibbles after a 1-byte exponent, through kvalues_mxfp4
        __m128i t = _mm_loadu_si128((const __m128i *)(r + 17 * c + 1));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), lo4);
        const __m128i kv = _mm_loadu_si128((const __m128i *)KV_MXFP4);
        return _mm256_shuffle_epi8(_mm256_set_m128i(kv, kv), v);
    }
    case T_IQ4_XS: {  // chunk c: sub-block c % 8 of super-block c / 8, through the table
        __m128i t = _mm_loadu_si128((const __m128i *)(r + 136 * (c / 8) + 8 + 16 * (c % 8)));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), lo4);
        const __m128i kv = _mm_loadu_si128((const __m128i *)KV_IQ4NL);
        return _mm256_shuffle_epi8(_mm256_set_m128i(kv, kv), v);
    }
    case T_Q5_0: {
        const uint8_t *b = r + 22 * c;
        __m128i t = _mm_loadu_si128((const __m128i *)(b + 6));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), lo4);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        // byte i = 0xFF where bit i of qh is set
        __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
        bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                 _mm256_set1_epi64x(-1));
        // (nibble | bit << 4) - 16: the nibble where the bit is set, nibble - 16 elsewhere
        return _mm256_or_si256(v, _mm256_andnot_si256(bits, _mm256_set1_epi8((char)0xF0)));
    }
    case T_Q6_K: {
        const int64_t j = c % 8, h = j / 4, jj = j % 4;
        const uint8_t *b = r + 210 * (c / 8);
        __m256i l = _mm256_loadu_si256((const __m256i *)(b + h * 64 + (jj & 1) * 32));
        if (jj >> 1) l = _mm256_srli_epi16(l, 4);
        __m256i hi = _mm256_loadu_si256((const __m256i *)(b + 128 + h * 32));
        hi = _mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128((int)(2 * jj))),
                              _mm256_set1_epi8(3));
        __m256i v = _mm256_or_si256(_mm256_and_si256(l, lo4), _mm256_slli_epi16(hi, 4));
        return _mm256_sub_epi8(v, _mm256_set1_epi8(32));
    }
    default:
        return _mm256_loadu_si256((const __m256i *)(qbuf + 32 * c));
    }
}
#endif

#if defined(__AVX2__)
// A Q4_0 / Q5_0 / MXFP4 row's values into qbuf (32 per chunk), decoded once for many activation
// rows (in place, every pass over 8 activation rows decodes each chunk again), and a Q6_K
// row's unsigned values u = q + 32 (kquant.h's T_BUF6). The same numbers as the in-place
// decode, so the same bits.
static void decode_values(int type, const uint8_t *row, int64_t K, int8_t *qbuf) {
    for (int64_t c = 0; c < K / 32; c++) {
        __m256i v = type == T_Q4_0   ? chunk_values(T_Q4_0, row, NULL, c)
                    : type == T_Q5_0 ? chunk_values(T_Q5_0, row, NULL, c)
                    : type == T_MXFP4 ? chunk_values(T_MXFP4, row, NULL, c)
                                     : _mm256_add_epi8(chunk_values(T_Q6_K, row, NULL, c),
                                                       _mm256_set1_epi8(32));
        _mm256_storeu_si256((__m256i *)(qbuf + 32 * c), v);
    }
}
#endif
