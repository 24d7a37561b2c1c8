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

// Fills p for one row of K values (K a multiple of 256); unpack: also its int8 values.
static void k_prepare(int type, const uint8_t *r, int64_t K, kprep_t *p, int unpack,
                      float *fs, float *fm) {
    int has_min;
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
