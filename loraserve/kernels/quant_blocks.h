// ggml block formats as the kernels read them: each type's rows unpacked to int8 values
// with a float scale and offset per 16 (value = s * q + mn), and the scales alone for the
// types that qmatmul.c decodes in place. Bit layouts follow ggml (and gguf-py's dequantize,
// the tests' reference).

#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30,
};

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

// ---- weight rows -> int8 values, scale and offset per 16 -------------------------------

typedef void (*unpack_fn)(const uint8_t *row, int64_t K, int8_t *q, float *s, float *mn);

static void unpack_q4_0(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    for (int64_t b = 0; b < K / 32; b++, r += 18, q += 32) {
        float d = half_to_float(r);
        for (int i = 0; i < 16; i++) {
            q[i] = (int8_t)((r[2 + i] & 15) - 8);
            q[i + 16] = (int8_t)((r[2 + i] >> 4) - 8);
        }
        s[2 * b] = s[2 * b + 1] = d;
        mn[2 * b] = mn[2 * b + 1] = 0.0f;
    }
}

static void unpack_q4_1(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    for (int64_t b = 0; b < K / 32; b++, r += 20, q += 32) {
        float d = half_to_float(r), m = half_to_float(r + 2);
        for (int i = 0; i < 16; i++) {
            q[i] = (int8_t)(r[4 + i] & 15);
            q[i + 16] = (int8_t)(r[4 + i] >> 4);
        }
        s[2 * b] = s[2 * b + 1] = d;
        mn[2 * b] = mn[2 * b + 1] = m;
    }
}

static void unpack_q5(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn, int with_min) {
    const int size = with_min ? 24 : 22, off = with_min ? 8 : 6, zero = with_min ? 0 : 16;
    for (int64_t b = 0; b < K / 32; b++, r += size, q += 32) {
        float d = half_to_float(r), m = with_min ? half_to_float(r + 2) : 0.0f;
        uint32_t qh;
        memcpy(&qh, r + off - 4, 4);
        for (int i = 0; i < 16; i++) {
            q[i] = (int8_t)(((r[off + i] & 15) | (((qh >> i) & 1) << 4)) - zero);
            q[i + 16] = (int8_t)(((r[off + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - zero);
        }
        s[2 * b] = s[2 * b + 1] = d;
        mn[2 * b] = mn[2 * b + 1] = m;
    }
}

static void unpack_q5_0(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    unpack_q5(r, K, q, s, mn, 0);
}

static void unpack_q5_1(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    unpack_q5(r, K, q, s, mn, 1);
}

static void unpack_q8_0(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    for (int64_t b = 0; b < K / 32; b++, r += 34, q += 32) {
        s[2 * b] = s[2 * b + 1] = half_to_float(r);
        mn[2 * b] = mn[2 * b + 1] = 0.0f;
        memcpy(q, r + 2, 32);
    }
}

static void unpack_q2_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // 16 scale bytes (low nibble scale, high nibble min) | 64 bytes of 2-bit q | d | dmin
    for (int64_t b = 0; b < K / 256; b++, r += 84, q += 256, s += 16, mn += 16) {
        float d = half_to_float(r + 80), dmin = half_to_float(r + 82);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    q[h * 128 + j * 32 + l] = (int8_t)((r[16 + h * 32 + l] >> (2 * j)) & 3);
        for (int j = 0; j < 16; j++) {
            s[j] = d * (float)(r[j] & 15);
            mn[j] = -(dmin * (float)(r[j] >> 4));
        }
    }
}

static void unpack_q3_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // hmask 32 | qs 64 (2-bit) | 12 bytes of 6-bit scales | d
    for (int64_t b = 0; b < K / 256; b++, r += 110, q += 256, s += 16, mn += 16) {
        float d = half_to_float(r + 108);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) {
                    int lo = (r[32 + h * 32 + l] >> (2 * j)) & 3;
                    int hb = (r[l] >> (h * 4 + j)) & 1;  // set: no offset; clear: minus 4
                    q[h * 128 + j * 32 + l] = (int8_t)(lo - ((hb ^ 1) << 2));
                }
        for (int i = 0; i < 16; i++) {
            int lo = i < 8 ? r[96 + i] & 15 : r[96 + i - 8] >> 4;
            int hi = (r[104 + (i & 3)] >> (2 * (i >> 2))) & 3;
            s[i] = d * (float)((lo | (hi << 4)) - 32);
            mn[i] = 0.0f;
        }
    }
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes, as ggml
// packs them; unpacked on 32-bit words, so that the bytes of u[0..1] are the 8 scales and
// those of u[2..3] the 8 mins (this runs once per 256 values of a row: kept short)
static inline void k_scale_words(const uint8_t *sb, uint32_t u[4]) {
    memcpy(u, sb, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    const uint32_t mins_lo = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = mins_lo;
    u[0] &= m1;
}

// the float scales d * sc and offsets -(dmin * m) per 16 values of one super-block
static void k_scales(const uint8_t *sb, float d, float dmin, float *s, float *mn) {
    uint32_t u[4];
    k_scale_words(sb, u);
#if defined(__AVX2__)
    __m256 vs = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                 _mm_set_epi32(0, 0, (int)u[1], (int)u[0]))));
    __m256 vm = _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                 _mm_set_epi32(0, 0, (int)u[3], (int)u[2]))));
    vm = _mm256_xor_ps(vm, _mm256_set1_ps(-0.0f));  // -(dmin * m), exactly
    __m256 lo = _mm256_unpacklo_ps(vs, vs), hi = _mm256_unpackhi_ps(vs, vs);
    _mm256_storeu_ps(s, _mm256_permute2f128_ps(lo, hi, 0x20));  // s0 s0 s1 s1 .. s3 s3
    _mm256_storeu_ps(s + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    lo = _mm256_unpacklo_ps(vm, vm);
    hi = _mm256_unpackhi_ps(vm, vm);
    _mm256_storeu_ps(mn, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(mn + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
#else
    const uint8_t *b = (const uint8_t *)u;
    for (int j = 0; j < 8; j++) {
        s[2 * j] = s[2 * j + 1] = d * (float)b[j];
        mn[2 * j] = mn[2 * j + 1] = -(dmin * (float)b[8 + j]);
    }
#endif
}

static void unpack_q4_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // d | dmin | 12 scale bytes | 128 bytes of nibbles (4 groups of 32 bytes)
    for (int64_t b = 0; b < K / 256; b++, r += 144, q += 256, s += 16, mn += 16) {
        k_scales(r + 4, half_to_float(r), half_to_float(r + 2), s, mn);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                q[g * 64 + l] = (int8_t)(r[16 + g * 32 + l] & 15);
                q[g * 64 + 32 + l] = (int8_t)(r[16 + g * 32 + l] >> 4);
            }
    }
}

static void unpack_q5_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // d | dmin | 12 scale bytes | qh 32 | 128 bytes of nibbles
    for (int64_t b = 0; b < K / 256; b++, r += 176, q += 256, s += 16, mn += 16) {
        k_scales(r + 4, half_to_float(r), half_to_float(r + 2), s, mn);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int lo = r[48 + g * 32 + l] & 15, hi = r[48 + g * 32 + l] >> 4;
                q[g * 64 + l] = (int8_t)(lo | (((r[16 + l] >> (2 * g)) & 1) << 4));
                q[g * 64 + 32 + l] = (int8_t)(hi | (((r[16 + l] >> (2 * g + 1)) & 1) << 4));
            }
    }
}

static void unpack_q6_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // ql 128 | qh 64 | 16 int8 scales | d
    for (int64_t b = 0; b < K / 256; b++, r += 210, q += 256, s += 16, mn += 16) {
        float d = half_to_float(r + 208);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++) {  // values h*128 + j*32 + l
                const uint8_t *ql = r + h * 64 + (j & 1) * 32, *qh = r + 128 + h * 32;
                const int ls = 4 * (j >> 1), hs = 2 * j;
                for (int l = 0; l < 32; l++)
                    q[h * 128 + j * 32 + l] =
                        (int8_t)((((ql[l] >> ls) & 15) | (((qh[l] >> hs) & 3) << 4)) - 32);
            }
        for (int j = 0; j < 16; j++) {
            s[j] = d * (float)(int8_t)r[192 + j];
            mn[j] = 0.0f;
        }
    }
}

#include "quant_nl.h"

static inline unpack_fn unpacker(int type, int *has_min) {
    *has_min = type == T_Q4_1 || type == T_Q5_1 || type == T_Q2_K || type == T_Q4_K ||
               type == T_Q5_K;
    switch (type) {
    case T_Q4_0: return unpack_q4_0;
    case T_Q4_1: return unpack_q4_1;
    case T_Q5_0: return unpack_q5_0;
    case T_Q5_1: return unpack_q5_1;
    case T_Q8_0: return unpack_q8_0;
    case T_Q2_K: return unpack_q2_k;
    case T_Q3_K: return unpack_q3_k;
    case T_Q4_K: return unpack_q4_k;
    case T_Q5_K: return unpack_q5_k;
    case T_Q6_K: return unpack_q6_k;
    default: return nl_unpacker(type);
    }
}

// ---- direct decoding: the common types are read from the file's blocks in SIMD -----------

// The scales of one row of a directly decoded legacy type (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4),
// s[c] for chunk c.
// One scale per 32 values, 8 at a time: the halves gathered into one vector with integer
// inserts, then converted together (one conversion per scale cost ~0.45 ns per 32 values of
// a 1.9 ns Q8_0 one-row matmul; this, ~0.25: measured).
static inline void row_scales(int type, const uint8_t *r, int64_t K, float *s, float *mn) {
    (void)mn;  // the directly decoded legacy types have no offsets
    if (type == T_MXFP4) {  // e8m0 exponents (exact powers of two)
        for (int64_t c = 0; c < K / 32; c++) s[c] = e8m0_half(r[17 * c]);
        return;
    }
    const int size = type == T_Q8_0 ? 34 : type == T_Q4_0 || type == T_IQ4_NL ? 18 : 22;
    const int64_t nc = K / 32;
    int64_t c = 0;
#if defined(__F16C__) && defined(__AVX2__)
    for (; c + 8 <= nc; c += 8) {
        const uint8_t *b = r + size * c;
        uint16_t h[8];
        for (int i = 0; i < 8; i++) memcpy(h + i, b + size * i, 2);
        __m128i v = _mm_cvtsi32_si128(h[0]);
        v = _mm_insert_epi16(v, h[1], 1);
        v = _mm_insert_epi16(v, h[2], 2);
        v = _mm_insert_epi16(v, h[3], 3);
        v = _mm_insert_epi16(v, h[4], 4);
        v = _mm_insert_epi16(v, h[5], 5);
        v = _mm_insert_epi16(v, h[6], 6);
        v = _mm_insert_epi16(v, h[7], 7);
        _mm256_storeu_ps(s + c, _mm256_cvtph_ps(v));
    }
#endif
    for (; c < nc; c++) s[c] = half_to_float(r + size * c);
}

#if defined(__AVX2__)
#define HAVE_DIRECT 1
#else
#define HAVE_DIRECT 0
#endif

static inline int direct(int type) {
    return type == T_Q8_0 || type == T_Q4_0 || type == T_Q5_0 || type == T_Q4_K || type == T_Q6_K ||
           type == T_IQ4_NL || type == T_IQ4_XS || type == T_Q5_K || type == T_Q2_K || type == T_Q3_K ||
           type == T_TQ2_0 || type == T_TQ1_0 || iq_block_bytes(type) > 0 || type == T_MXFP4;
}

