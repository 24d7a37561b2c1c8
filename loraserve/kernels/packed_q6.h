// Dense Q6_K rows packed 8 to a group: the layout of pack_q6k.h (the grouped expert
// kernels'), byte for byte, so a matrix packed here or there reads the same in both (the
// tests compare the bytes). For the dense projections of Q*_K_M files (Gemma 3 270M keeps
// half its ffn_down in Q6_K): in its own layout a 512-row Q6_K matmul took 1.7x the time of
// the packed Q4_K one of the same shape.
//
// Numbers: the integer sum per (row, super-block) of kquant.h's Q6_K path (the stored values
// u = q + 32 times the activations, each 16-value sub-block times its scale, less 32 * sum_j
// sc_j * bs16_j) and its float steps, y = y + (d_b * xd_b) * isum_b: the bits of the rows
// read in their own layout, whatever M or the tile.
//
// Layout, per group of 8 rows, per super-block (256 values), 1680 B:
//   f16 d[8 rows] | int8 sc[16 sub-blocks j][8 rows] |
//   per sub-block j, 96 B: n0[8 rows][4] | n1[8 rows][4] | hb[8 rows][4]
//   n0 byte (r, i): low nibble = low 4 bits of value 16j + i, high = of 16j + 4 + i;
//   n1: of values 16j + 8 + i and 16j + 12 + i; hb: bits 2s..2s+1 = the high 2 bits of
//   value 16j + 4s + i.

#pragma once

#include "packed_steps.h"

#define PQ6_SB 1680  // bytes per group per super-block

// The 256 stored 6-bit values u of a file Q6_K block (ql[128] | qh[64] | sc[16] | d), or
// (dir 0) the block's ql and qh from them: value 128h + 32k + l has the low nibble of
// ql[64h + 32(k & 1) + l] (high nibble for k >= 2) and bits 2k, 2k + 1 of qh[32h + l].
static void pq6_file_values(uint8_t *blk, uint8_t u[256], int dir) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            uint8_t *q0 = blk + 64 * h + l, *q1 = q0 + 32, *qh = blk + 128 + 32 * h + l;
            uint8_t *v = u + 128 * h + l;
            if (dir) {
                v[0] = (uint8_t)((*q0 & 15) | ((*qh & 3) << 4));
                v[32] = (uint8_t)((*q1 & 15) | (((*qh >> 2) & 3) << 4));
                v[64] = (uint8_t)((*q0 >> 4) | (((*qh >> 4) & 3) << 4));
                v[96] = (uint8_t)((*q1 >> 4) | (((*qh >> 6) & 3) << 4));
            } else {
                *q0 = (uint8_t)((v[0] & 15) | ((v[64] & 15) << 4));
                *q1 = (uint8_t)((v[32] & 15) | ((v[96] & 15) << 4));
                *qh = (uint8_t)((v[0] >> 4) | ((v[32] >> 4) << 2) | ((v[64] >> 4) << 4) |
                                ((v[96] >> 4) << 6));
            }
        }
}

// One group of 8 rows (src rows at stride row_bytes) <-> its packed bytes g; dir 1 packs.
static void pq6_group(uint8_t *rows, int64_t row_bytes, int64_t K, uint8_t *g, int dir) {
    uint8_t u[256];
    for (int64_t b = 0; b < K / 256; b++) {
        uint8_t *pb = g + PQ6_SB * b;
        for (int r = 0; r < PK_ROWS; r++) {
            uint8_t *fb = rows + r * row_bytes + 210 * b;
            if (dir) {
                memcpy(pb + 2 * r, fb + 208, 2);
                for (int j = 0; j < 16; j++) pb[16 + 8 * j + r] = fb[192 + j];
                pq6_file_values(fb, u, 1);
            } else {
                memcpy(fb + 208, pb + 2 * r, 2);
                for (int j = 0; j < 16; j++) fb[192 + j] = pb[16 + 8 * j + r];
            }
            for (int j = 0; j < 16; j++) {
                uint8_t *sb = pb + 144 + 96 * j, *v = u + 16 * j;
                for (int i = 0; i < 4; i++) {
                    uint8_t *n0 = sb + 4 * r + i, *n1 = n0 + 32, *hb = n0 + 64;
                    if (dir) {
                        *n0 = (uint8_t)((v[i] & 15) | ((v[4 + i] & 15) << 4));
                        *n1 = (uint8_t)((v[8 + i] & 15) | ((v[12 + i] & 15) << 4));
                        *hb = (uint8_t)((v[i] >> 4) | ((v[4 + i] >> 4) << 2) |
                                        ((v[8 + i] >> 4) << 4) | ((v[12 + i] >> 4) << 6));
                    } else {
                        v[i] = (uint8_t)((*n0 & 15) | ((*hb & 3) << 4));
                        v[4 + i] = (uint8_t)((*n0 >> 4) | (((*hb >> 2) & 3) << 4));
                        v[8 + i] = (uint8_t)((*n1 & 15) | (((*hb >> 4) & 3) << 4));
                        v[12 + i] = (uint8_t)((*n1 >> 4) | (((*hb >> 6) & 3) << 4));
                    }
                }
            }
            if (!dir) pq6_file_values(fb, u, 0);
        }
    }
}

// 8 rows (group g) of packed Q6_K against R (1..4, compile-time) activation rows quantized
// per 256: x [R, K], xd [R, K/256], bs16 [R, K/16]: y[r * ldy + 0..7].
static inline __attribute__((always_inline)) void pq6_dot(
    const uint8_t *g, const int8_t *x, const float *xd, const int16_t *bs16, int64_t K, int R,
    int ahead, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
#if defined(__AVX2__)
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), h2 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + PQ6_SB * b;
        const int8_t *xb = x + 256 * b;
        __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
        for (int j = 0; j < 16; j++) {
            const uint8_t *sb = blk + 144 + 96 * j;
            if (ahead) PREFETCH(sb), PREFETCH(sb + 64);
            const __m256i n0 = _mm256_loadu_si256((const __m256i *)sb);
            const __m256i n1 = _mm256_loadu_si256((const __m256i *)(sb + 32));
            const __m256i hv = _mm256_loadu_si256((const __m256i *)(sb + 64));
            // 16-bit shifts: the masks keep each byte's own bits
            const __m256i w0 = _mm256_or_si256(_mm256_and_si256(n0, lo4),
                                               _mm256_and_si256(_mm256_slli_epi16(hv, 4), h2));
            const __m256i w1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), lo4),
                                               _mm256_and_si256(_mm256_slli_epi16(hv, 2), h2));
            const __m256i w2 = _mm256_or_si256(_mm256_and_si256(n1, lo4), _mm256_and_si256(hv, h2));
            const __m256i w3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), lo4),
                                               _mm256_and_si256(_mm256_srli_epi16(hv, 2), h2));
            const __m256i s32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 8 * j)));
            const __m256i sp = PK_PAIRS16(256, s32, s32);
#define LS_PR(r, acc, yy) PK_SUB16(256, acc, w0, w1, w2, w3, xb + (r) * K + 16 * j, sp)
            PK_EACH(LS_PR, i, y);
#undef LS_PR
        }
        // 32 * sum_j sc_j * bs16_j per row lane: sub-block pairs (sc_2k, sc_2k+1)
        __m256i mp[8];
        for (int k = 0; k < 8; k++) {
            const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 16 * k)));
            const __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 24 + 16 * k)));
            mp[k] = PK_PAIRS16(256, lo, hi);
        }
        const __m256 d = pk_halves8(blk);
#define LS_PF(r, acc, yy)                                                                     \
    PK_SB_END(256, acc, yy, mp, 8, bs16 + (r) * (K / 16) + 16 * b, 5, 0, d, d, xd[(r) * nb + b])
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
                const uint8_t *blk = g + PQ6_SB * b;
                int32_t is = 0;
                for (int j = 0; j < 16; j++) {
                    const uint8_t *sb = blk + 144 + 96 * j;
                    int32_t s = 0;
                    for (int st = 0; st < 4; st++)
                        for (int i = 0; i < 4; i++) {
                            const uint8_t nb4 = sb[32 * (st / 2) + 4 * l + i];
                            const int u = (st & 1 ? nb4 >> 4 : nb4 & 15) |
                                          (((sb[64 + 4 * l + i] >> (2 * st)) & 3) << 4);
                            s += (u - 32) * x[r * K + 256 * b + 16 * j + 4 * st + i];
                        }
                    is += (int8_t)blk[16 + 8 * j + l] * s;
                }
                acc = acc + (half_to_float(blk + 2 * l) * xd[r * nb + b]) * (float)is;
            }
            y[r * ldy + l] = acc;
        }
    (void)bs16;
#endif
}

