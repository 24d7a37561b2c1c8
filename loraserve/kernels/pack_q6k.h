// Q6_K rows repacked 8 to a group (the packed.h idea for the 6-bit K-quant): a vector holds
// 4 consecutive values of each of 8 weight rows, so a sub-block's sums are vertical adds and
// the float steps run once per super-block for 8 rows. Used by the grouped expert matmuls
// (moe.c), where Q4_K_M files keep ffn_down_exps in Q6_K for some layers: in its own layout
// a Q6_K row ran at about half the packed Q4_K rate there. The layout is packed_q6.h's, byte
// for byte (the dense kernels' packing, tested equal), and the experts are read by its tiles
// (qparts.h's part_packed: pq6_dot, and two groups at once on AVX-512 builds), which give
// every output the bits of the row read in its own layout, whatever M or the tile.
//
// Layout, per group of 8 rows, per super-block (256 values), 1680 B (8 x 210, the file's):
//   f16 d[8 rows] | int8 sc[16 sub-blocks j][8 rows] |
//   per sub-block j, 96 B: n0[8 rows][4] | n1[8 rows][4] | hb[8 rows][4]
//   n0 byte (r, i): low nibble = low 4 bits of value 16j + i, high = of 16j + 4 + i;
//   n1: of values 16j + 8 + i and 16j + 12 + i; hb: bits 2s..2s+1 = the high 2 bits of
//   value 16j + 4s + i.

#pragma once

#include "packed.h"

#define Q6P_SB 1680  // bytes per group per super-block

// The 256 stored 6-bit values u of a file Q6_K block (ql[128] | qh[64] | sc[16] | d), or
// (dir 0) the block's ql and qh from them: value 128h + 32k + l has the low nibble of
// ql[64h + 32(k & 1) + l] (high nibble for k >= 2) and bits 2k, 2k + 1 of qh[32h + l].
static void q6_file_values(uint8_t *blk, uint8_t u[256], int dir) {
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
static void q6p_group(uint8_t *rows, int64_t row_bytes, int64_t K, uint8_t *g, int dir) {
    uint8_t u[256];
    for (int64_t b = 0; b < K / 256; b++) {
        uint8_t *pb = g + Q6P_SB * b;
        for (int r = 0; r < PK_ROWS; r++) {
            uint8_t *fb = rows + r * row_bytes + 210 * b;
            if (dir) {
                memcpy(pb + 2 * r, fb + 208, 2);
                for (int j = 0; j < 16; j++) pb[16 + 8 * j + r] = fb[192 + j];
                q6_file_values(fb, u, 1);
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
            if (!dir) q6_file_values(fb, u, 0);
        }
    }
}

// rows [N, row_bytes] of Q6_K -> packed [N / 8][K / 256 * 1680] (dir 1), or back (dir 0).
// Returns 0, or -1 when N is not whole groups, K not whole super-blocks or rows too short.
int ls_repack_q6k(uint8_t *rows, int64_t N, int64_t K, int64_t row_bytes, uint8_t *packed,
                  int dir, int nthreads) {
    if (N % PK_ROWS != 0 || K <= 0 || K % 256 != 0 || row_bytes < K / 256 * 210) return -1;
    const int64_t gb = K / 256 * Q6P_SB;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t g = 0; g < N / PK_ROWS; g++)
        q6p_group(rows + g * PK_ROWS * row_bytes, row_bytes, K, packed + g * gb, dir);
    return 0;
}
