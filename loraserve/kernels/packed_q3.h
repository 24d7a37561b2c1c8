// Dense Q3_K, Q2_K and TQ2_0 rows packed 8 to a group, for decode rows (a 1-row matmul read each
// row's 2- or 3-bit values and scales in place, one row after another: 0.86x and 0.71x
// libggml's time at 1 row).
//
// Numbers: the integer sums per (row, super-block) of kquant.h's Q3_K and Q2_K paths (the
// stored values u (Q3_K: q + 4, 0..7; Q2_K: q, 0..3) times the activations, each 16-value
// sub-block times its scale: isum; Q3_K less 4 * sum_j sc_j * bs16_j, Q2_K with msum =
// sum_j mn_j * bs16_j) and their float steps, y = y + (d_b * xd_b) * isum_b [Q2_K: y = y -
// (dm_b * xd_b) * msum_b]: the bits of the rows read in their own layout, whatever M or
// the tile.
//
// Layouts, per group of 8 rows, per super-block (256 values):
//   Q3_K 912 B (1.036x the file's: the 6-bit scales as bytes):
//     f16 d[8 rows] | int8 sc[16 sub-blocks j][8 rows] (the 6-bit scale less 32) |
//     per pair of sub-blocks (2p, 2p + 1), 96 B: q0[8 rows][4] | q1[8 rows][4] | hb[8 rows][4]
//     q0 byte (r, i): bits 2s..2s+1 = the low 2 bits of value 16 (2p) + 4s + i; q1: of
//     16 (2p + 1) + 4s + i; hb: bit s = the third bit of the first, bit 4 + s of the second.
//   Q2_K 672 B (the file's bytes): f16 d[8] | f16 dmin[8] | u8 scm[16 j][8 rows] (the
//     file's byte: scale in the low nibble, min in the high) | q[16 j][8 rows][4] (bits
//     2s..2s+1 = value 16 j + 4s + i).
//   TQ2_0 528 B (the file's bytes): f16 d[8] | q[16 j][8 rows][4] as Q2_K's; u = q + 1
//     (0..2), scales 1, less sum_j bs16_j (kquant.h's TQ2_0 integers).

#pragma once

#include "packed_steps.h"

#define PQ3_SB 912  // bytes per group per super-block (Q3_K)
#define PQ2_SB 672  // (Q2_K)
#define PQT_SB 528  // (TQ2_0)
#define PQ_SB(q2) ((q2) == 2 ? PQT_SB : (q2) ? PQ2_SB : PQ3_SB)

// One group of 8 Q2_K (tq 0) or TQ2_0 (tq 1) rows <-> its packed bytes g (dir 1 packs). The
// file's blocks: Q2_K scales[16] | qs[64] | f16 d | f16 dmin, TQ2_0 qs[64] | f16 d; value
// 128h + 32j + l has the bits 2j of qs[32h + l].
static void pq2_group(int tq, uint8_t *rows, int64_t row_bytes, int64_t K, uint8_t *g, int dir) {
#define LS_MOVE(packed, raw, n)                                                               \
    do {                                                                                      \
        if (dir) memcpy((packed), (raw), (n));                                                \
        else memcpy((raw), (packed), (n));                                                    \
    } while (0)
    const int fsb = tq ? 66 : 84, sbb = tq ? PQT_SB : PQ2_SB, qv = tq ? 16 : 160, fq = tq ? 0 : 16;
    for (int64_t b = 0; b < K / 256; b++) {
        uint8_t *pb = g + sbb * b;
        for (int r = 0; r < PK_ROWS; r++) {
            uint8_t *fb = rows + r * row_bytes + fsb * b;
            LS_MOVE(pb + 2 * r, fb + fq + 64, 2);
            if (!tq) {
                LS_MOVE(pb + 16 + 2 * r, fb + 82, 2);
                for (int j = 0; j < 16; j++) LS_MOVE(pb + 32 + 8 * j + r, fb + j, 1);
            }
            if (!dir) memset(fb + fq, 0, 64);
            for (int v = 0; v < 256; v++) {
                const int h = v / 128, j = v % 128 / 32, l = v % 32;
                const int jj = v / 16, s = v % 16 / 4, i = v % 4;
                uint8_t *q = pb + qv + 32 * jj + 4 * r + i, *f = fb + fq + 32 * h + l;
                if (dir && s == 0) *q = 0;
                if (dir) *q |= (uint8_t)(((*f >> (2 * j)) & 3) << (2 * s));
                else *f |= (uint8_t)(((*q >> (2 * s)) & 3) << (2 * j));
            }
        }
    }
#undef LS_MOVE
}

// One group of 8 rows (src rows at stride row_bytes) <-> its packed bytes g; dir 1 packs.
// The file's block: hmask[32] | qs[64] | scales[12] | f16 d; value 128h + 32j + l has the
// bits 2j of qs[32h + l] and bit 4h + j of hmask[l]; scale i: its low nibble in byte i
// (i < 8) or the high one of byte i - 8, its high 2 bits at bit 2 (i / 4) of byte 8 + i % 4.
static void pq3_group(uint8_t *rows, int64_t row_bytes, int64_t K, uint8_t *g, int dir) {
    for (int64_t b = 0; b < K / 256; b++) {
        uint8_t *pb = g + PQ3_SB * b;
        for (int r = 0; r < PK_ROWS; r++) {
            uint8_t *fb = rows + r * row_bytes + 110 * b, u[256];
            if (dir) {
                memcpy(pb + 2 * r, fb + 108, 2);
                for (int i = 0; i < 16; i++) {
                    const int lo = i < 8 ? fb[96 + i] & 15 : fb[88 + i] >> 4;
                    const int hi = (fb[104 + (i & 3)] >> (2 * (i >> 2))) & 3;
                    pb[16 + 8 * i + r] = (uint8_t)(int8_t)((lo | (hi << 4)) - 32);
                }
                for (int v = 0; v < 256; v++) {
                    const int h = v / 128, j = v % 128 / 32, l = v % 32;
                    u[v] = (uint8_t)(((fb[32 + 32 * h + l] >> (2 * j)) & 3) |
                                     (((fb[l] >> (4 * h + j)) & 1) << 2));
                }
            } else {
                memcpy(fb + 108, pb + 2 * r, 2);
                memset(fb + 96, 0, 12);
                for (int i = 0; i < 16; i++) {
                    const int e = (int8_t)pb[16 + 8 * i + r] + 32;
                    fb[i < 8 ? 96 + i : 88 + i] |= (uint8_t)(i < 8 ? e & 15 : (e & 15) << 4);
                    fb[104 + (i & 3)] |= (uint8_t)((e >> 4) << (2 * (i >> 2)));
                }
            }
            for (int p = 0; p < 8; p++) {
                uint8_t *sb = pb + 144 + 96 * p;
                for (int i = 0; i < 4; i++) {
                    uint8_t *q0 = sb + 4 * r + i, *q1 = q0 + 32, *hb = q0 + 64;
                    if (dir) *q0 = *q1 = *hb = 0;
                    for (int s = 0; s < 4; s++)
                        for (int k = 0; k < 2; k++) {
                            uint8_t *q = k ? q1 : q0, *v = u + 16 * (2 * p + k) + 4 * s + i;
                            if (dir) {
                                *q |= (uint8_t)((*v & 3) << (2 * s));
                                *hb |= (uint8_t)((*v >> 2) << (4 * k + s));
                            } else {
                                *v = (uint8_t)(((*q >> (2 * s)) & 3) | (((*hb >> (4 * k + s)) & 1) << 2));
                            }
                        }
                }
            }
            if (dir) continue;
            memset(fb, 0, 96);
            for (int v = 0; v < 256; v++) {
                const int h = v / 128, j = v % 128 / 32, l = v % 32;
                fb[32 + 32 * h + l] |= (uint8_t)((u[v] & 3) << (2 * j));
                fb[l] |= (uint8_t)((u[v] >> 2) << (4 * h + j));
            }
        }
    }
}

// 8 rows (group g) of packed Q3_K (q2 0), Q2_K (q2 1) or TQ2_0 (q2 2; compile-time) against R (1..4,
// compile-time) activation rows quantized per 256: x [R, K], xd [R, K/256], bs16 [R, K/16]:
// y[r * ldy + 0..7].
static inline __attribute__((always_inline)) void pq3_dot(
    const uint8_t *g, int q2, const int8_t *x, const float *xd, const int16_t *bs16, int64_t K,
    int R, int ahead, float *y, int64_t ldy) {
    const int64_t nb = K / 256, sbb = PQ_SB(q2);
#if defined(__AVX2__)
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m256i m3 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4), m15 = _mm256_set1_epi32(15);
    (void)b2, (void)m15;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + sbb * b;
        const int8_t *xb = x + 256 * b;
        __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
        for (int p = 0; p < 8; p++) {
            const uint8_t *sb = q2 == 2 ? blk + 16 + 64 * p : q2 ? blk + 160 + 64 * p : blk + 144 + 96 * p;
            if (ahead) PREFETCH(sb), PREFETCH(sb + 64);
            const __m256i hv = q2 ? i0 : _mm256_loadu_si256((const __m256i *)(sb + 64));
            for (int k = 0; k < 2; k++) {
                const int j = 2 * p + k;
                const __m256i q = _mm256_loadu_si256((const __m256i *)(sb + 32 * k));
                // u of step s: bits 2s..2s+1 of q, and (Q3_K) bit 4k + s of hv at bit 2
                // (16-bit shifts: the masks keep each byte's own bits)
#define LS_W(s)                                                                               \
    (q2 ? _mm256_and_si256(_mm256_srli_epi16(q, 2 * (s)), m3)                                 \
        : _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * (s)), m3),                \
                          _mm256_and_si256(4 * k + (s) <= 2 ? _mm256_slli_epi16(hv, 2 - 4 * k - (s)) \
                                                            : _mm256_srli_epi16(hv, 4 * k + (s) - 2), b2)))
                const __m256i w0 = LS_W(0), w1 = LS_W(1), w2 = LS_W(2), w3 = LS_W(3);
#undef LS_W
                const __m128i s8 = _mm_loadl_epi64((const __m128i *)(blk + (q2 ? 32 : 16) + 8 * j));
                const __m256i s32 = q2 == 2 ? _mm256_set1_epi32(1)  // TQ2_0: scales 1
                                    : q2 ? _mm256_and_si256(_mm256_cvtepu8_epi32(s8), m15) : _mm256_cvtepi8_epi32(s8);
                const __m256i sp = PK_PAIRS16(256, s32, s32);
                // int16 sums of the 4 steps: at most 4 * 2 * 7 * 127 = 7112, exact
#define LS_PR(r, acc, yy)                                                                     \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 16 * j;                                              \
        acc = PK_KMADD256(acc, _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w0, pk_bcast4(xr)), \
                                                              _mm256_maddubs_epi16(w1, pk_bcast4(xr + 4))), \
                                             _mm256_add_epi16(_mm256_maddubs_epi16(w2, pk_bcast4(xr + 8)), \
                                                              _mm256_maddubs_epi16(w3, pk_bcast4(xr + 12)))), \
                       sp);                                                                   \
    } while (0)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
// TQ2_0's scales are 1: dpbusd's int32 sums straight (the same integers)
#define LS_PRB(r, acc, yy)                                                                    \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 16 * j;                                              \
        const __m256i z_ = _mm256_setzero_si256();  /* two short chains, then acc */         \
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(                                          \
            _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(z_, w0, pk_bcast4(xr)), w1, pk_bcast4(xr + 4)), \
            _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(z_, w2, pk_bcast4(xr + 8)), w3, pk_bcast4(xr + 12)))); \
    } while (0)
                if (q2 == 2) PK_EACH(LS_PRB, i, y);
                else PK_EACH(LS_PR, i, y);
#undef LS_PRB
#else
                PK_EACH(LS_PR, i, y);
#endif
#undef LS_PR
            }
        }
        // per row lane, sub-block pairs (2k, 2k + 1): Q3_K's scales (4 * sum_j sc_j * bs16_j
        // comes off), Q2_K's mins (msum)
        __m256i mp[8];
        for (int k = 0; k < 8; k++) {
            const uint8_t *s0 = blk + (q2 ? 32 : 16) + 16 * k;
            const __m256i lo = q2 ? _mm256_srli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s0)), 4)
                                  : _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)s0));
            const __m256i hi = q2 ? _mm256_srli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s0 + 8))), 4)
                                  : _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s0 + 8)));
            mp[k] = q2 == 2 ? _mm256_set1_epi32(0x00010001) : PK_PAIRS16(256, lo, hi);
        }
        const __m256 d = pk_halves8(blk), dm = q2 == 1 ? pk_halves8(blk + 16) : d;
#define LS_PF(r, acc, yy)                                                                     \
    PK_SB_END(256, acc, yy, mp, 8, bs16 + (r) * (K / 16) + 16 * b, q2 ? 0 : 2, q2 == 1, d, dm, xd[(r) * nb + b])
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
                const uint8_t *blk = g + sbb * b;
                int32_t is = 0, ms = 0;
                for (int j = 0; j < 16; j++) {
                    const uint8_t *sb = q2 == 2 ? blk + 16 + 32 * j : q2 ? blk + 160 + 32 * j : blk + 144 + 96 * (j / 2);
                    int32_t s = 0;
                    for (int st = 0; st < 4; st++)
                        for (int i = 0; i < 4; i++) {
                            const uint8_t qb = sb[(q2 ? 0 : 32 * (j & 1)) + 4 * l + i];
                            int u = (qb >> (2 * st)) & 3;
                            if (!q2) u = (u | (((sb[64 + 4 * l + i] >> (4 * (j & 1) + st)) & 1) << 2)) - 4;
                            s += u * x[r * K + 256 * b + 16 * j + 4 * st + i];
                        }
                    if (q2 == 2) {  // TQ2_0: u = q + 1, scales 1
                        is += s - bs16[r * (K / 16) + 16 * b + j];
                    } else if (q2) {
                        const uint8_t scm = blk[32 + 8 * j + l];
                        is += (scm & 15) * s;
                        ms += (scm >> 4) * bs16[r * (K / 16) + 16 * b + j];
                    } else {
                        is += (int8_t)blk[16 + 8 * j + l] * s;
                    }
                }
                const float xs = xd[r * nb + b];
                acc = acc + (half_to_float(blk + 2 * l) * xs) * (float)is;
                if (q2 == 1) acc = acc - (half_to_float(blk + 16 + 2 * l) * xs) * (float)ms;
            }
            y[r * ldy + l] = acc;
        }
    (void)bs16;
#endif
}
