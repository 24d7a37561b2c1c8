// The non-linear 4-bit types (IQ4_NL, IQ4_XS, MXFP4) and the ternary ones (TQ1_0, TQ2_0) as
// the kernels read them (included by quant_blocks.h): every one is int8 values times scales,
// so the integer dot products of the other types apply unchanged.
//   IQ4_NL, MXFP4 (blocks of 32, activations per 32 as llama.cpp's Q8_0): values from a
//     16-entry table, one float scale per block (fp16 d; MXFP4 an e8m0 power of two);
//   IQ4_XS, TQ1_0, TQ2_0 (blocks of 256, activations per 256 as its Q8_K, kquant.h): one
//     fp16 d per 256 and integer scales per 16 (IQ4_XS: ls - 32 per 32; ternary: 1), so a
//     super-block's dot product is one exact integer, as ggml computes it.
// Layouts and tables as ggml-common.h (and gguf-py's dequantize, the tests' reference).

#pragma once

#include "quant_iq.h"

enum { T_IQ4_NL = 20, T_IQ4_XS = 23, T_TQ1_0 = 34, T_TQ2_0 = 35, T_MXFP4 = 39 };

static const int8_t KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t KV_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// the K-form types: per-256 activations, integer scales per 16 (nl_k_scales)
// (and the grid types of quant_iq.h)
static inline int is_nl_kform(int type) {
    return type == T_IQ4_XS || type == T_TQ1_0 || type == T_TQ2_0 || iq_block_bytes(type) > 0;
}

// bytes per block (of 32 or 256 values), or 0 for another type
static inline int64_t nl_block_bytes(int type, int64_t *block) {
    *block = 256;
    switch (type) {
    case T_IQ4_NL: *block = 32; return 18;
    case T_MXFP4: *block = 32; return 17;
    case T_IQ4_XS: return 136;
    case T_TQ1_0: return 54;
    case T_TQ2_0: return 66;
    default: return iq_block_bytes(type);
    }
}

// ggml's e8m0_to_fp32_half: 2^(e - 128) (bits 0x00200000 << e below e = 2)
static inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// 32 values from 16 bytes of nibbles (low nibbles first) through a table
static inline void nib_table(const uint8_t *qs, const int8_t *kv, int8_t *q) {
#if defined(__AVX2__)  // one shuffle per 16 values (the same lookups)
    const __m128i t = _mm_loadu_si128((const __m128i *)kv), v = _mm_loadu_si128((const __m128i *)qs);
    const __m128i m15 = _mm_set1_epi8(15);
    _mm_storeu_si128((__m128i *)q, _mm_shuffle_epi8(t, _mm_and_si128(v, m15)));
    _mm_storeu_si128((__m128i *)(q + 16), _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(v, 4), m15)));
    return;
#endif
    for (int i = 0; i < 16; i++) {
        q[i] = kv[qs[i] & 15];
        q[i + 16] = kv[qs[i] >> 4];
    }
}

static void unpack_iq4_nl(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    for (int64_t b = 0; b < K / 32; b++, r += 18, q += 32) {
        nib_table(r + 2, KV_IQ4NL, q);
        s[2 * b] = s[2 * b + 1] = half_to_float(r);
        mn[2 * b] = mn[2 * b + 1] = 0.0f;
    }
}

static void unpack_mxfp4(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    for (int64_t b = 0; b < K / 32; b++, r += 17, q += 32) {
        nib_table(r + 1, KV_MXFP4, q);
        s[2 * b] = s[2 * b + 1] = e8m0_half(r[0]);
        mn[2 * b] = mn[2 * b + 1] = 0.0f;
    }
}

// The integer scales per 16 values of super-block x of a K-form type, and its d.
static inline float nl_k_scales(int type, const uint8_t *x, int16_t *sc) {
    if (iq_block_bytes(type) > 0) return iq_k_scales(type, x, sc);
    if (type == T_IQ4_XS) {
        uint16_t sh;
        memcpy(&sh, x + 2, 2);
        for (int j = 0; j < 8; j++) {
            const int ls = ((x[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4);
            sc[2 * j] = sc[2 * j + 1] = (int16_t)(ls - 32);
        }
        return half_to_float(x);
    }
    for (int j = 0; j < 16; j++) sc[j] = 1;
    return half_to_float(x + (type == T_TQ1_0 ? 52 : 64));
}

// a ternary digit: ((byte * 3^k mod 256) * 3) >> 8, minus 1 (ggml's TQ1_0 packing)
static inline int8_t trit(uint8_t v, int pow3) {
    return (int8_t)((((uint8_t)(v * pow3)) * 3 >> 8) - 1);
}

static void unpack_nl_k(int type, const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    static const int P3[5] = {1, 3, 9, 27, 81};
    const int64_t size = type == T_IQ4_XS ? 136 : type == T_TQ1_0 ? 54 : 66;
    for (int64_t b = 0; b < K / 256; b++, r += size, q += 256) {
        int16_t sc[16];
        const float d = nl_k_scales(type, r, sc);
        for (int j = 0; j < 16; j++) {
            s[16 * b + j] = d * (float)sc[j];
            mn[16 * b + j] = 0.0f;
        }
        if (type == T_IQ4_XS) {
            for (int j = 0; j < 8; j++) nib_table(r + 8 + 16 * j, KV_IQ4NL, q + 32 * j);
        } else if (type == T_TQ2_0) {  // value 128 k + 32 l + j: bits 2l of byte 32 k + j
            for (int k = 0; k < 2; k++)
                for (int l = 0; l < 4; l++)
                    for (int j = 0; j < 32; j++)
                        q[128 * k + 32 * l + j] = (int8_t)(((r[32 * k + j] >> (2 * l)) & 3) - 1);
        } else {  // TQ1_0: 32 bytes x 5 trits, 16 x 5, then 4 x 4 (qh)
            for (int n = 0; n < 5; n++)
                for (int i = 0; i < 32; i++) q[32 * n + i] = trit(r[i], P3[n]);
            for (int n = 0; n < 5; n++)
                for (int i = 0; i < 16; i++) q[160 + 16 * n + i] = trit(r[32 + i], P3[n]);
            for (int n = 0; n < 4; n++)
                for (int i = 0; i < 4; i++) q[240 + 4 * n + i] = trit(r[48 + i], P3[n]);
        }
    }
}

static void unpack_iq4_xs(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    unpack_nl_k(T_IQ4_XS, r, K, q, s, mn);
}
static void unpack_tq1_0(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    unpack_nl_k(T_TQ1_0, r, K, q, s, mn);
}
static void unpack_tq2_0(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    unpack_nl_k(T_TQ2_0, r, K, q, s, mn);
}

// this header's unpacker for `type`, or NULL
static inline unpack_fn nl_unpacker(int type) {
    switch (type) {
    case T_IQ4_NL: return unpack_iq4_nl;
    case T_MXFP4: return unpack_mxfp4;
    case T_IQ4_XS: return unpack_iq4_xs;
    case T_TQ1_0: return unpack_tq1_0;
    case T_TQ2_0: return unpack_tq2_0;
    default: return iq_unpacker(type);
    }
}
