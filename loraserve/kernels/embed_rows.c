// Looked-up rows of a quantized embedding table to float32 (model/layers.py RowEmbedding):
// dequant.py's torch routine forms ~20 small tensors for one row (70 us of a decode step's
// ~11 ms on granitehybrid's Q6_K table); this forms the same float32 products, in the same
// order, in one pass. Q6_K: (d * scale) * (q - 32); Q8_0: q * d. A scale that is not finite
// (f16 exponent 31) is refused (-1): dequant.py's NaN payload handling stays the one answer.

#include <stdint.h>
#include <stdlib.h>

#include "f16.h"

static int d16(const uint8_t *p, float *d) {
    const uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    if (((h >> 10) & 0x1F) == 0x1F) return -1;
    *d = f16_to_f32(h);
    return 0;
}

// rows [n, row_bytes] uint8 of ggml type (14 Q6_K, 8 Q8_0), K values a row -> out [n, K].
// Returns 0, -1 a scale that is not finite, -3 a type or size this does not read.
int ls_dequant_rows(int type, const uint8_t *rows, int64_t n, int64_t K, int64_t row_bytes,
                    float *out) {
    if (n < 0 || K < 1 || !rows || !out) return -3;
    if (type == 14) {  // block: ql 128 | qh 64 | 16 int8 scales | d f16; 256 values
        if (K % 256 || row_bytes != K / 256 * 210) return -3;
        for (int64_t b = 0; b < n * (K / 256); b++) {
            const uint8_t *blk = rows + b * 210, *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            float d, *y = out + b * 256;
            if (d16(blk + 208, &d)) return -1;
            for (int e = 0; e < 256; e++) {
                const int h = e >> 7, j = e & 127, c = j >> 5, l = j & 31;
                const int lo = j < 64 ? ql[h * 64 + j] & 0x0F : ql[h * 64 + j - 64] >> 4;
                const int q = lo | (((qh[h * 32 + l] >> (2 * c)) & 3) << 4);
                y[e] = (d * (float)sc[e >> 4]) * ((float)q - 32.0f);
            }
        }
        return 0;
    }
    if (type == 8) {  // block: d f16 | 32 int8
        if (K % 32 || row_bytes != K / 32 * 34) return -3;
        for (int64_t b = 0; b < n * (K / 32); b++) {
            const uint8_t *blk = rows + b * 34;
            const int8_t *q = (const int8_t *)(blk + 2);
            float d;
            if (d16(blk, &d)) return -1;
            for (int e = 0; e < 32; e++) out[b * 32 + e] = (float)q[e] * d;
        }
        return 0;
    }
    return -3;
}

// packed.c: a table's rows repacked 8 to a group, and back (dir 0).
int64_t ls_packed_group_bytes(int type, int64_t K);
int ls_repack(int type, uint8_t *rows, int64_t N, int64_t K, int64_t row_bytes, uint8_t *packed,
              int dir, int nthreads);

// Rows ids [n] (int64) of a table of V rows packed 8 to a group (packed.c, RowEmbedding's
// tied output copy) -> out [n, K]: each row's group unpacked to the file's bytes, then
// ls_dequant_rows on the row. The Python lookup did the same in ~12 torch ops (0.2 ms of a
// granitehybrid decode step); these are the same bytes, so the same values. Returns
// ls_dequant_rows' codes; -3 also an id outside 0..V-1 or a group size not packed.c's;
// -2 out of memory.
int ls_dequant_packed_rows(int type, const uint8_t *packed, int64_t V, int64_t group_bytes,
                           const int64_t *ids, int64_t n, int64_t K, int64_t row_bytes,
                           float *out) {
    if (n < 0 || V < 8 || V % 8 || K < 1 || row_bytes < 1 || !packed || !ids || !out) return -3;
    if (group_bytes != ls_packed_group_bytes(type, K)) return -3;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) return -3;
    uint8_t *rows = malloc((size_t)(8 * row_bytes));
    if (!rows) return -2;
    int64_t at = -1;  // the group unpacked in rows
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const int64_t g = ids[i] / 8;
        if (g != at) {
            rc = ls_repack(type, rows, 8, K, row_bytes, (uint8_t *)packed + g * group_bytes, 0, 1);
            if (rc != 0) {
                rc = -3;
                break;
            }
            at = g;
        }
        rc = ls_dequant_rows(type, rows + (ids[i] % 8) * row_bytes, 1, K, row_bytes, out + i * K);
    }
    free(rows);
    return rc;
}
