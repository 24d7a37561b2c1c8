// lora16.c's per-row products for up to 4 rows that share one adapter (the rows of a step
// grouped by adapter, as Punica's and S-LoRA's SGMV kernels do): each weight vector is
// widened once and multiplied into every row of the group, so a step reads and widens each
// adapter once per group instead of once per row. Every output is still its own chain of
// the very operations lora_h16 / lora_b16 give it, in the same order (an accumulator per
// (row, rank) or (row, lane) where those have one per rank or lane), so its bits do not
// depend on which rows share the group. Each call also asks for the next work item's
// weights (`pf`, `pf_lines` cache lines), a few lines a step of its loop: an item's
// weights are tens of KB from memory once a step holds more adapters than the caches do,
// and the hardware prefetcher only ramps up within a stream.

#pragma once

#include <stdint.h>

#if defined(__AVX2__)

#define LS_AI static inline __attribute__((always_inline))

// the next item's lines [*done, *done + n) of pf, as far as pf_lines
LS_AI void pf_step(const char *pf, int64_t pf_lines, int64_t *done, int64_t n) {
    for (int64_t e = *done + n < pf_lines ? *done + n : pf_lines; *done < e; (*done)++)
        __builtin_prefetch(pf + 64 * *done, 0, 0);
}

// h_q[r] = dot(A[r], x_q) * sc_q for ranks [r0, r0 + RG) and m rows, lora_h16's
// operations (RG accumulators of 8 lanes per row, hsum8, then the columns past K / 8 * 8)
LS_AI void h_group(const uint16_t *A, int64_t r0, const float *const *xs, int64_t K,
                   const float *sc, float *const *hs, const int m, const int RG,
                   const char *pf, int64_t pf_lines, int64_t *done, int64_t per) {
    __m256 acc[4][8];
    for (int q = 0; q < m; q++)
        for (int j = 0; j < RG; j++) acc[q][j] = _mm256_setzero_ps();
    const uint16_t *w = A + r0 * K;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        pf_step(pf, pf_lines, done, per);
        for (int j = 0; j < RG; j++) {
            const __m256 wv = ld16x8(w + j * K + k);
            for (int q = 0; q < m; q++)
                acc[q][j] = madd8(wv, _mm256_loadu_ps(xs[q] + k), acc[q][j]);
        }
    }
    for (int q = 0; q < m; q++)
        for (int j = 0; j < RG; j++) {
            float t = hsum8(acc[q][j]);
            for (int64_t kk = k; kk < K; kk++) t += h2f(w + j * K + kk) * xs[q][kk];
            hs[q][r0 + j] = t * sc[q];
        }
}

// lora_h16 for m rows (1 to 4) of one adapter: ranks 8 at a time for one row, 4 at a time
// for more (lora_h16's 4 and dot16's 1 give each rank the same chain)
LS_AI void h_rows(const uint16_t *A, int64_t rank, const float *const *xs, int64_t K,
                  const float *sc, float *const *hs, const int m, const char *pf,
                  int64_t pf_lines) {
    int64_t r = 0, done = 0;
    const int64_t iters = (rank + 3) / 4 * (K / 8) + 1;
    const int64_t per = (pf_lines + iters - 1) / iters;
    if (m == 1)
        for (; r + 8 <= rank; r += 8) h_group(A, r, xs, K, sc, hs, 1, 8, pf, pf_lines, &done, per);
    if (m == 4)
        for (; r + 2 <= rank; r += 2) h_group(A, r, xs, K, sc, hs, 4, 2, pf, pf_lines, &done, per);
    for (; r + 4 <= rank; r += 4) h_group(A, r, xs, K, sc, hs, m, 4, pf, pf_lines, &done, per);
    for (; r < rank; r++) h_group(A, r, xs, K, sc, hs, m, 1, pf, pf_lines, &done, per);
    pf_step(pf, pf_lines, &done, pf_lines);
}

// lora_b16 for one row over whole tiles [lo, hi) (multiples of 8), its very operations,
// asking for pf's lines meanwhile (grouping rows here, with their 8 accumulators each, was
// slower: 16 of them do not fit the registers beside the tile)
LS_AI void b_row(const uint16_t *bt, int64_t r, const float *h, float *y, int64_t lo,
                 int64_t hi, const char *pf, int64_t pf_lines) {
    int64_t done = 0;
    const int64_t per = (pf_lines + (hi - lo) / 8) / ((hi - lo) / 8 + 1) + 1;
    for (int64_t o = lo; o + 8 <= hi; o += 8) {
        pf_step(pf, pf_lines, &done, per);
        b16_tile(bt + o * r, r, h, y + o);  // lora_b16's very operations
    }
    pf_step(pf, pf_lines, &done, pf_lines);
}

#undef LS_AI
#endif
