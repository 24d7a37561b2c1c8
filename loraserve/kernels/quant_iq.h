// The grid types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M as the kernels read
// them (included by quant_nl.h): blocks of 256 whose values are grid bytes times signs
// (IQ1: grid values -1/0/1 plus a +-1/8 shift) under a float d and a small odd integer scale
// per 16 or 32 values. Each is written as int8 values q, integer scales per 16 and one float
// scale per 256 (kquant.h's K-form, activations per 256 as llama.cpp's Q8_K), exactly:
//   IQ2_*: d * (0.5 + ls) * 0.25 * g = (d / 8) * (2 ls + 1) * g        (g in {8, 25, 43})
//   IQ3_XXS: d * (0.5 + ls) * 0.5 * g = (d / 4) * (2 ls + 1) * g       (g in 4 .. 62)
//   IQ3_S: d * (1 + 2 ls) * g                                          (g in 1 .. 15)
//   IQ1_*: d * (2 ls + 1) * (g +- 1/8) = (d / 8) * (2 ls + 1) * (8 g +- 1)
// so a super-block's dot product is one exact integer, as ggml computes it. Tables as
// ggml-common.h (iq_grids.h, iq1_grid.h); layouts as ggml-quants.c's dequantize_row_*.

#pragma once

#include "iq1_grid.h"
#include "iq_grids.h"

enum {
    T_IQ2_XXS = 16, T_IQ2_XS = 17, T_IQ3_XXS = 18, T_IQ1_S = 19, T_IQ3_S = 21, T_IQ2_S = 22,
    T_IQ1_M = 29,
};

static inline int64_t iq_block_bytes(int type) {
    switch (type) {
    case T_IQ2_XXS: return 66;
    case T_IQ2_XS: return 74;
    case T_IQ2_S: return 82;
    case T_IQ3_XXS: return 98;
    case T_IQ3_S: return 110;
    case T_IQ1_S: return 50;
    case T_IQ1_M: return 56;
    default: return 0;
    }
}

static inline uint32_t iq_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint16_t iq_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

// 8 values: the grid entry's bytes (lowest first), negated where bit j of signs is set
static inline void iq_put8(int8_t *q, uint64_t g, uint8_t signs) {
#if defined(__AVX2__)  // (v ^ m) - m with m = -1 where the bit is set: the same 8 values
    const __m128i bit = _mm_set_epi64x(0, (long long)0x8040201008040201ULL);
    const __m128i m = _mm_cmpeq_epi8(_mm_and_si128(_mm_set1_epi8((char)signs), bit), bit);
    _mm_storel_epi64((__m128i *)q, _mm_sub_epi8(_mm_xor_si128(_mm_cvtsi64_si128((long long)g), m), m));
    return;
#endif
    for (int j = 0; j < 8; j++) {
        const int v = (int)((g >> (8 * j)) & 0xFF);
        q[j] = (int8_t)((signs >> j) & 1 ? -v : v);
    }
}

// IQ1: 8 values 8 g +- 1 from an iq1s_grid entry (bytes -1, 0, 1)
static inline void iq1_put8(int8_t *q, uint64_t g, int neg) {
#if defined(__AVX2__)  // 8 g: a 16-bit shift, each byte's low 3 bits cleared (the same bytes)
    const __m128i v8 = _mm_and_si128(_mm_slli_epi16(_mm_cvtsi64_si128((long long)g), 3), _mm_set1_epi8((char)0xF8));
    _mm_storel_epi64((__m128i *)q, _mm_add_epi8(v8, _mm_set1_epi8(neg ? -1 : 1)));
    return;
#endif
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(8 * (int8_t)((g >> (8 * j)) & 0xFF) + (neg ? -1 : 1));
}

// IQ1_M's fp16 d, spread over the top nibbles of its four scale words
static inline float iq1m_d(const uint8_t *x) {
    const uint8_t *s = x + 48;
    const uint16_t h = (uint16_t)((iq_u16(s) >> 12) | ((iq_u16(s + 2) >> 8) & 0x00f0) |
                                  ((iq_u16(s + 4) >> 4) & 0x0f00) | (iq_u16(s + 6) & 0xf000));
    uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
    return half_to_float(b);
}

// The integer scales per 16 values of super-block x, and its float scale per 256.
static inline float iq_k_scales(int type, const uint8_t *x, int16_t *sc) {
    for (int ib = 0; ib < 8; ib++) {
        int a, b;
        switch (type) {
        case T_IQ2_XXS: a = b = 2 * (int)(iq_u32(x + 2 + 8 * ib + 4) >> 28) + 1; break;
        case T_IQ3_XXS: a = b = 2 * (int)(iq_u32(x + 66 + 4 * ib) >> 28) + 1; break;
        case T_IQ2_XS: case T_IQ2_S: {
            const uint8_t s = x[(type == T_IQ2_XS ? 66 : 74) + ib];
            a = 2 * (s & 15) + 1, b = 2 * (s >> 4) + 1;
            break;
        }
        case T_IQ3_S: a = b = 1 + 2 * ((x[106 + ib / 2] >> (4 * (ib % 2))) & 15); break;
        case T_IQ1_S: a = b = 2 * ((iq_u16(x + 34 + 2 * ib) >> 12) & 7) + 1; break;
        default: {  // IQ1_M
            const uint16_t w = iq_u16(x + 48 + 2 * (ib / 2));
            a = 2 * ((w >> (6 * (ib % 2))) & 7) + 1, b = 2 * ((w >> (6 * (ib % 2) + 3)) & 7) + 1;
        }
        }
        sc[2 * ib] = (int16_t)a;
        sc[2 * ib + 1] = (int16_t)b;
    }
    switch (type) {
    case T_IQ3_XXS: return half_to_float(x) * 0.25f;
    case T_IQ3_S: return half_to_float(x);
    case T_IQ1_M: return iq1m_d(x) * 0.125f;
    default: return half_to_float(x) * 0.125f;
    }
}

// One super-block's 256 int8 values
static void iq_values(int type, const uint8_t *x, int8_t *q) {
    for (int ib = 0; ib < 8; ib++, q += 32) {
        for (int l = 0; l < 4; l++) {
            int8_t *o = q + 8 * l;
            switch (type) {
            case T_IQ2_XXS: {
                const uint32_t s = iq_u32(x + 2 + 8 * ib + 4);
                iq_put8(o, IQ2XXS_GRID[x[2 + 8 * ib + l]], KSIGNS_IQ2XS[(s >> (7 * l)) & 127]);
                break;
            }
            case T_IQ2_XS: {
                const uint16_t v = iq_u16(x + 2 + 2 * (4 * ib + l));
                iq_put8(o, IQ2XS_GRID[v & 511], KSIGNS_IQ2XS[v >> 9]);
                break;
            }
            case T_IQ2_S: {
                const int idx = x[2 + 4 * ib + l] | ((x[66 + ib] << (8 - 2 * l)) & 0x300);
                iq_put8(o, IQ2S_GRID[idx], x[34 + 4 * ib + l]);
                break;
            }
            case T_IQ3_XXS: {
                const uint8_t sg = KSIGNS_IQ2XS[(iq_u32(x + 66 + 4 * ib) >> (7 * l)) & 127];
                const uint64_t g = IQ3XXS_GRID[x[2 + 8 * ib + 2 * l]] |
                                   (uint64_t)IQ3XXS_GRID[x[2 + 8 * ib + 2 * l + 1]] << 32;
                iq_put8(o, g, sg);
                break;
            }
            case T_IQ3_S: {
                const uint8_t qh = x[66 + ib];
                const int i1 = x[2 + 8 * ib + 2 * l] | ((qh << (8 - 2 * l)) & 256);
                const int i2 = x[2 + 8 * ib + 2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
                iq_put8(o, IQ3S_GRID[i1] | (uint64_t)IQ3S_GRID[i2] << 32, x[74 + 4 * ib + l]);
                break;
            }
            case T_IQ1_S: {
                const uint16_t qh = iq_u16(x + 34 + 2 * ib);
                iq1_put8(o, IQ1S_GRID[x[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)],
                         qh & 0x8000);
                break;
            }
            default: {  // IQ1_M: qh nibble per 8 values: 3 index bits, then the shift's sign
                const uint8_t h = (uint8_t)(x[32 + 2 * ib + l / 2] >> (4 * (l % 2)));
                iq1_put8(o, IQ1S_GRID[x[4 * ib + l] | ((h & 7) << 8)], h & 8);
            }
            }
        }
    }
}

static void unpack_iq(int type, const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    const int64_t size = iq_block_bytes(type);
    for (int64_t b = 0; b < K / 256; b++, r += size, q += 256) {
        int16_t sc[16];
        const float d = iq_k_scales(type, r, sc);
        for (int j = 0; j < 16; j++) {
            s[16 * b + j] = d * (float)sc[j];
            mn[16 * b + j] = 0.0f;
        }
        iq_values(type, r, q);
    }
}

#define IQ_UNPACK(T, NAME)                                                                    \
    static void NAME(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {           \
        unpack_iq(T, r, K, q, s, mn);                                                         \
    }
IQ_UNPACK(T_IQ2_XXS, unpack_iq2_xxs)
IQ_UNPACK(T_IQ2_XS, unpack_iq2_xs)
IQ_UNPACK(T_IQ2_S, unpack_iq2_s)
IQ_UNPACK(T_IQ3_XXS, unpack_iq3_xxs)
IQ_UNPACK(T_IQ3_S, unpack_iq3_s)
IQ_UNPACK(T_IQ1_S, unpack_iq1_s)
IQ_UNPACK(T_IQ1_M, unpack_iq1_m)
#undef IQ_UNPACK

static inline unpack_fn iq_unpacker(int type) {
    switch (type) {
    case T_IQ2_XXS: return unpack_iq2_xxs;
    case T_IQ2_XS: return unpack_iq2_xs;
    case T_IQ2_S: return unpack_iq2_s;
    case T_IQ3_XXS: return unpack_iq3_xxs;
    case T_IQ3_S: return unpack_iq3_s;
    case T_IQ1_S: return unpack_iq1_s;
    case T_IQ1_M: return unpack_iq1_m;
    default: return NULL;
    }
}
