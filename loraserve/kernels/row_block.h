// Row blocks of a recurrent state (deltanet.c, ssm_scan.c): rows 0 .. nr - 1 of a row-major
// matrix m (row length S) in and out of a block blk [S][nr], one lane per row, so that a
// block's rows run through every token together (blk[j nr + l] = m[l S + j]). Copies only.
#pragma once
#include <stdint.h>

static inline void row_block_in(const float *m, float *blk, int64_t nr, int64_t S) {
    for (int64_t l = 0; l < nr; l++)
        for (int64_t j = 0; j < S; j++) blk[j * nr + l] = m[l * S + j];
}

static inline void row_block_out(const float *blk, float *m, int64_t nr, int64_t S) {
    for (int64_t j = 0; j < S; j++)
        for (int64_t l = 0; l < nr; l++) m[l * S + j] = blk[j * nr + l];
}
