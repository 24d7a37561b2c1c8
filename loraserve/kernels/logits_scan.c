// One pass over a step's logits: which rows hold an inf or NaN, and each row's first
// maximum (torch.argmax on a finite row).
//
// Measured in the engine (Gemma 270M decode, 262,144 logits a row): the torch sum that
// checked the rows, the chunked argmax and the copy for a bias took ~0.45 ms a step; this
// pass ~0.2 ms (the logits were just written by both threads), ~0.04 ms on warm rows.
//
// Non-finite: x - x is 0 for a finite value and NaN for inf or NaN, so a row's sum of
// x - x is NaN exactly when the row holds one (no overflow can fake it, as a plain sum of
// huge finite values could).

#include <stdint.h>

#include "simd.h"

typedef struct {
    float max;
    int64_t arg;
    int bad;
} piece_t;

// x[lo:hi]: its first maximum (arg -1 for an empty range) and whether it holds inf or NaN.
static piece_t scan_piece(const float *x, int64_t lo, int64_t hi) {
    piece_t p = {0.0f, -1, 0};
    int64_t i = lo;
    float nan_acc = 0.0f;
#if defined(__AVX2__)
    if (hi - lo >= 8) {
        __m256 vmax = _mm256_loadu_ps(x + lo), acc = _mm256_sub_ps(vmax, vmax);
        __m256i vidx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), cur = vidx;
        const __m256i step = _mm256_set1_epi32(8);
        // lane l sees x[lo + l + 8j]; a strictly greater value replaces it, so each lane
        // keeps its first maximum (indices relative to lo, below 2^31: rows are < 2^31)
        for (i = lo + 8; i + 8 <= hi; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            cur = _mm256_add_epi32(cur, step);
            acc = _mm256_add_ps(acc, _mm256_sub_ps(v, v));
            __m256 gt = _mm256_cmp_ps(v, vmax, _CMP_GT_OQ);
            vmax = _mm256_blendv_ps(vmax, v, gt);
            vidx = _mm256_blendv_epi8(vidx, cur, _mm256_castps_si256(gt));
        }
        float m[8], a[8];
        int32_t id[8];
        _mm256_storeu_ps(m, vmax);
        _mm256_storeu_ps(a, acc);
        _mm256_storeu_si256((__m256i *)id, vidx);
        p.max = m[0];
        p.arg = lo + id[0];
        for (int l = 0; l < 8; l++) {
            nan_acc += a[l];
            if (m[l] > p.max || (m[l] == p.max && lo + id[l] < p.arg)) {
                p.max = m[l];
                p.arg = lo + id[l];
            }
        }
    }
#endif
    for (; i < hi; i++) {
        nan_acc += x[i] - x[i];
        if (p.arg < 0 || x[i] > p.max) {
            p.max = x[i];
            p.arg = i;
        }
    }
    p.bad = nan_acc != nan_acc;
    return p;
}

// For R rows of V values (row stride ld): bad[r] = 1 where row r holds an inf or NaN, else
// 0; arg[r] = the index of its first maximum (meaningful for finite rows only). A row is
// split into one piece per thread when there are fewer rows than threads.
int ls_scan_rows(const float *x, int64_t R, int64_t V, int64_t ld, uint8_t *bad, int64_t *arg,
                 int nthreads) {
    if (R < 0 || V < 1 || (R > 1 && ld < V)) return -3;
    if (R * V < (1 << 15)) nthreads = 1;
    const int64_t P = R < nthreads ? nthreads : 1;
    piece_t *ps = __builtin_alloca(sizeof(piece_t) * (size_t)(P > 1 ? P : 1));
    if (P > 1) {  // R < nthreads: rows one after another, each split across the threads
        for (int64_t r = 0; r < R; r++) {
            const float *row = x + r * ld;
#pragma omp parallel for num_threads(nthreads) schedule(static)
            for (int64_t k = 0; k < P; k++) ps[k] = scan_piece(row, V * k / P, V * (k + 1) / P);
            piece_t best = ps[0];
            for (int64_t k = 1; k < P; k++) {
                best.bad |= ps[k].bad;
                if (ps[k].arg >= 0 && (best.arg < 0 || ps[k].max > best.max)) {
                    best.max = ps[k].max;
                    best.arg = ps[k].arg;
                }
            }
            bad[r] = (uint8_t)best.bad;
            arg[r] = best.arg;
        }
        return 0;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < R; r++) {
        piece_t p = scan_piece(x + r * ld, 0, V);
        bad[r] = (uint8_t)p.bad;
        arg[r] = p.arg;
    }
    return 0;
}
