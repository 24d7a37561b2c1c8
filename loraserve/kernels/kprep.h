// A K-quant row's integer scales and minima per 16 values and float d/dmin per 256, read
// once per row for the unpacked path (kquant.h's T_BUF), with its int8 values if asked.

#pragma once

#include "quant_blocks.h"

// int16 scales/mins per 16 values, float d/dmin per 256, of a K-quant row (and its int8
// values when unpacked): w = d_b * sc_j * q - dm_b * mn_j.
typedef struct {
    int16_t *sc, *mn;
    float *d, *dm;
    int8_t *q;
    int ahead;  // few activation rows (a decode step): in-place rows prefetch ahead (simd.h)
} kprep_t;

static inline int is_kquant(int type) {
    return (type >= T_Q2_K && type <= T_Q6_K) || is_nl_kform(type);
}
static inline int k_has_min(int type) {
    return type == T_Q2_K || type == T_Q4_K || type == T_Q5_K;
}

#if defined(__AVX2__)
// The int8 values of a Q2_K, Q3_K or Q5_K row of K values into q, 32 at a time: the numbers
// their unpackers write (quant_blocks.h), whose scalar loops were most of a decode row's
// time (Q3_K: ~70% of a 1-row matmul in perf's samples). Returns 0 for another type.
// TQ1_0's trits of the bytes v at power p = 3^n (quant_nl.h trit): ((v * p mod 256) * 3 >> 8)
// - 1 per byte, in 16-bit lanes (even bytes, then odd ones)
static inline __m256i k_trits(__m256i v, int p) {
    const __m256i pp = _mm256_set1_epi16((short)p), three = _mm256_set1_epi16(3),
                  lo8 = _mm256_set1_epi16(0xFF);
    const __m256i e = _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(v, lo8), pp), lo8);
    const __m256i o = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(v, 8), pp), lo8);
    const __m256i t = _mm256_or_si256(_mm256_srli_epi16(_mm256_mullo_epi16(e, three), 8),
                                      _mm256_slli_epi16(_mm256_srli_epi16(_mm256_mullo_epi16(o, three), 8), 8));
    return _mm256_sub_epi8(t, _mm256_set1_epi8(1));
}

static int k_values(int type, const uint8_t *r, int64_t K, int8_t *q) {
    if (type == T_TQ1_0) {  // 32 bytes x 5 trits, 16 x 5, then 4 x 4 (unpack_nl_k's order)
        static const int P3[5] = {1, 3, 9, 27, 81};
        for (int64_t b = 0; b < K / 256; b++) {
            const uint8_t *x = r + 54 * b;
            int8_t *o = q + 256 * b, t[32];
            const __m256i a = _mm256_loadu_si256((const __m256i *)x);
            uint8_t tail[32] = {0};
            memcpy(tail, x + 32, 20);  // the 16 bytes, then the 4 (and 12 unused)
            const __m256i c = _mm256_loadu_si256((const __m256i *)tail);
            for (int n = 0; n < 5; n++) {
                _mm256_storeu_si256((__m256i *)(o + 32 * n), k_trits(a, P3[n]));
                _mm256_storeu_si256((__m256i *)t, k_trits(c, P3[n]));
                memcpy(o + 160 + 16 * n, t, 16);
                if (n < 4) memcpy(o + 240 + 4 * n, t + 16, 4);
            }
        }
        return 1;
    }
    if (type != T_Q2_K && type != T_Q3_K && type != T_Q5_K && type != T_TQ2_0) return 0;
    const __m256i m1 = _mm256_set1_epi8(1), m3 = _mm256_set1_epi8(3), lo4 = _mm256_set1_epi8(15);
#define LS_SR(v, n) _mm256_srl_epi16(v, _mm_cvtsi32_si128(n))
#define LS_ST(o, v) _mm256_storeu_si256((__m256i *)(o), v)
    for (int64_t b = 0; b < K / 256; b++) {
        int8_t *o = q + 256 * b;
        if (type == T_Q2_K || type == T_TQ2_0) {  // value 128h + 32j + l: bits 2j, 2j + 1 of
            // qs[32h + l] (TQ2_0: qs first, less 1)
            const int tq = type == T_TQ2_0;
            const uint8_t *x = tq ? r + 66 * b : r + 84 * b + 16;
            for (int h = 0; h < 2; h++) {
                const __m256i qs = _mm256_loadu_si256((const __m256i *)(x + 32 * h));
                for (int j = 0; j < 4; j++)
                    LS_ST(o + 128 * h + 32 * j, _mm256_sub_epi8(_mm256_and_si256(LS_SR(qs, 2 * j), m3),
                                                                _mm256_set1_epi8((char)tq)));
            }
        } else if (type == T_Q3_K) {  // the same, less 4 where bit 4h + j of hmask[l] is clear
            const uint8_t *x = r + 110 * b;
            const __m256i hm = _mm256_loadu_si256((const __m256i *)x);
            for (int h = 0; h < 2; h++) {
                const __m256i qs = _mm256_loadu_si256((const __m256i *)(x + 32 + 32 * h));
                for (int j = 0; j < 4; j++) {
                    const __m256i lo = _mm256_and_si256(LS_SR(qs, 2 * j), m3);
                    const __m256i hb = _mm256_and_si256(LS_SR(hm, 4 * h + j), m1);
                    LS_ST(o + 128 * h + 32 * j, _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)),
                                                                _mm256_set1_epi8(4)));
                }
            }
        } else {  // Q5_K: nibbles of qs[32g + l], fifth bits 2g and 2g + 1 of qh[l]
            const uint8_t *x = r + 176 * b;
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x + 16));
            for (int g = 0; g < 4; g++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(x + 48 + 32 * g));
                const __m256i h0 = _mm256_and_si256(LS_SR(qh, 2 * g), m1);
                const __m256i h1 = _mm256_and_si256(LS_SR(qh, 2 * g + 1), m1);
                LS_ST(o + 64 * g, _mm256_or_si256(_mm256_and_si256(v, lo4), _mm256_slli_epi16(h0, 4)));
                LS_ST(o + 64 * g + 32, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4),
                                                       _mm256_slli_epi16(h1, 4)));
            }
        }
    }
#undef LS_ST
#undef LS_SR
    return 1;
}

// The stored values u >= 0 of chunk j (0..7: values 32j ..) of a super-block blk, 32 at a
// time: Q6_K's u = q + 32 (ql | qh), Q3_K's q + 4 (qs | hmask), Q2_K's q (qs); 16-bit
// shifts, the masks keep each byte's own bits. The numbers the unpackers write, plus the
// offset.
static inline __attribute__((always_inline)) __m256i k_chunk_u(int type, const uint8_t *blk,
                                                                int j) {
    const int h = j / 4, jj = j % 4;
    const __m256i m3 = _mm256_set1_epi8(3);
#define LS_LD(o) _mm256_loadu_si256((const __m256i *)(blk + (o)))
#define LS_SR(v, n) _mm256_srl_epi16(v, _mm_cvtsi32_si128(n))
    if (type == T_Q2_K) return _mm256_and_si256(LS_SR(LS_LD(16 + 32 * h), 2 * jj), m3);
    if (type == T_Q3_K) {
        const __m256i hb = _mm256_and_si256(LS_SR(LS_LD(0), 4 * h + jj), _mm256_set1_epi8(1));
        return _mm256_or_si256(_mm256_and_si256(LS_SR(LS_LD(32 + 32 * h), 2 * jj), m3),
                               _mm256_slli_epi16(hb, 2));
    }
    __m256i l = LS_LD(h * 64 + (jj & 1) * 32);
    if (jj >> 1) l = _mm256_srli_epi16(l, 4);
    const __m256i hi = _mm256_and_si256(LS_SR(LS_LD(128 + h * 32), 2 * jj), m3);
    return _mm256_or_si256(_mm256_and_si256(l, _mm256_set1_epi8(0x0F)), _mm256_slli_epi16(hi, 4));
#undef LS_SR
#undef LS_LD
}

// A Q3_K super-block's 16 six-bit scales (12 bytes at s: low nibbles, then 2-bit highs),
// less 32, as int16: kprep's scalar loop in a few vector operations
static inline __m256i k_q3_scales(const uint8_t *s) {
    const __m128i a = _mm_loadl_epi64((const __m128i *)s);  // scale i < 8: a[i] & 15, else a[i - 8] >> 4
    const __m128i lo = _mm_and_si128(_mm_unpacklo_epi64(a, _mm_srli_epi16(a, 4)), _mm_set1_epi8(15));
    uint32_t h;
    memcpy(&h, s + 8, 4);  // scale i's high bits: bits 2 (i / 4) of byte i % 4
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)h), _mm_set_epi32(6, 4, 2, 0)),
                                     _mm_set1_epi8(3));
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32)));
}
#endif

// Fills p for one row of K values (K a multiple of 256); unpack: also its int8 values.
static void k_prepare(int type, const uint8_t *r, int64_t K, kprep_t *p, int unpack,
                      float *fs, float *fm) {
    int has_min;
#if defined(__AVX2__)
    if (unpack && k_values(type, r, K, p->q)) unpack = 0;  // the values without the scales
#endif
    if (unpack) unpacker(type, &has_min)(r, K, p->q, fs, fm);  // values only are used
    for (int64_t b = 0; b < K / 256; b++) {
        int16_t *sc = p->sc + 16 * b, *mn = p->mn + 16 * b;
        switch (type) {
        case T_Q2_K: {
            const uint8_t *x = r + 84 * b;
            p->d[b] = half_to_float(x + 80);
            p->dm[b] = half_to_float(x + 82);
            for (int j = 0; j < 16; j++) {
                sc[j] = x[j] & 15;
                mn[j] = x[j] >> 4;
            }
            break;
        }
        case T_Q3_K: {
            const uint8_t *x = r + 110 * b;
            p->d[b] = half_to_float(x + 108);
            p->dm[b] = 0.0f;
            for (int i = 0; i < 16; i++) {
                int lo = i < 8 ? x[96 + i] & 15 : x[96 + i - 8] >> 4;
                int hi = (x[104 + (i & 3)] >> (2 * (i >> 2))) & 3;
                sc[i] = (int16_t)((lo | (hi << 4)) - 32);
                mn[i] = 0;
            }
            break;
        }
        case T_Q4_K: case T_Q5_K: {
            const uint8_t *x = r + (type == T_Q4_K ? 144 : 176) * b;
            uint32_t u[4];
            k_scale_words(x + 4, u);
            const uint8_t *s8 = (const uint8_t *)u, *m8 = s8 + 8;
            p->d[b] = half_to_float(x);
            p->dm[b] = half_to_float(x + 2);
            for (int j = 0; j < 8; j++) {
                sc[2 * j] = sc[2 * j + 1] = s8[j];
                mn[2 * j] = mn[2 * j + 1] = m8[j];
            }
            break;
        }
        case T_Q6_K: {
            const uint8_t *x = r + 210 * b;
            p->d[b] = half_to_float(x + 208);
            p->dm[b] = 0.0f;
            for (int j = 0; j < 16; j++) {
                sc[j] = (int8_t)x[192 + j];
                mn[j] = 0;
            }
            break;
        }
        default: {  // IQ4_XS, TQ1_0, TQ2_0 (quant_nl.h)
            int64_t blk;
            p->d[b] = nl_k_scales(type, r + nl_block_bytes(type, &blk) * b, sc);
            p->dm[b] = 0.0f;
            for (int j = 0; j < 16; j++) mn[j] = 0;
            break;
        }
        }
    }
}
