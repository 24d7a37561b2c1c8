// LoRA deltas from half-precision A and B: ls_lora's (floatmm.c) exact operations on the
// same values, reading half the bytes and holding no float32 copy.
//
// A step whose rows use different adapters reads every one of them: ~11 MB of float32 A
// and B-transposed per rank-12 adapter of Gemma 270M's seven projections, streamed from
// memory, so a decode step with 8 distinct adapters read ~90 MB more than with one. An
// adapter stored as float16 (every GGUF LoRA llama.cpp's converter writes) widens to
// float32 exactly, so its halves can be read instead and widened in registers: each
// output then gets the very multiply-adds, in the very order, that ls_lora gives it from
// the float32 copy, so the bits are the same (tests compare the two bitwise), and a row's
// delta still depends on its own input row alone. B is held as 8-output tiles plus the
// rows past the last whole tile (its tail) as halves too, so such an adapter is kept in
// memory as its file's halves alone.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_blocks.h"  // half_to_float
#include "simd.h"

static inline float h2f(const uint16_t *p) { return half_to_float((const uint8_t *)p); }

#if defined(__AVX2__)
// 8 halves widened to 8 floats (exact)
static inline __m256 ld16x8(const uint16_t *p) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = h2f(p + i);
    return _mm256_loadu_ps(f);
#endif
}

// y[0..8) += the 8 outputs of one B tile (8 columns interleaved over the rank: tile[k * 8 + c])
// times h [r]: 8 accumulator chains over the rank in fixed order, then the remainder. The
// prefetches ask for the tile 4 on (hints, no bit changes). Shared by lora_b16 and b_row.
static inline __attribute__((always_inline)) void b16_tile(const uint16_t *tile, int64_t r,
                                                           const float *h, float *y) {
    const int64_t r8 = r / 8 * 8;
    __builtin_prefetch(tile + 4 * r * 8, 0, 0);
    __builtin_prefetch(tile + 4 * r * 8 + 32, 0, 0);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
#define LS_LANE16(i, acc) \
    acc = madd8(ld16x8(tile + (j + (i)) * 8), _mm256_broadcast_ss(h + j + (i)), acc)
    for (int64_t j = 0; j < r8; j += 8) {
        LS_LANE16(0, a0);
        LS_LANE16(1, a1);
        LS_LANE16(2, a2);
        LS_LANE16(3, a3);
        LS_LANE16(4, a4);
        LS_LANE16(5, a5);
        LS_LANE16(6, a6);
        LS_LANE16(7, a7);
    }
#undef LS_LANE16
    __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a4), _mm256_add_ps(a2, a6)),
                               _mm256_add_ps(_mm256_add_ps(a1, a5), _mm256_add_ps(a3, a7)));
    for (int64_t k = r8; k < r; k++)
        sum = _mm256_add_ps(sum, _mm256_mul_ps(ld16x8(tile + k * 8), _mm256_broadcast_ss(h + k)));
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), sum));
}
#endif

#include "lora16_rows.h"

// floatmm.c's dot_f with w in halves: the same operations on the same values
static inline float dot16(const uint16_t *w, const float *x, int64_t K) {
    int64_t k = 0;
    float r = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) acc = madd8(ld16x8(w + k), _mm256_loadu_ps(x + k), acc);
    r = hsum8(acc);
#endif
    for (; k < K; k++) r += h2f(w + k) * x[k];
    return r;
}

// floatmm.c's lora_h: h[r] = dot(A[r], x) * sc, 4 ranks' chains side by side (lora16_rows.h's
// h_rows gives each rank the same chain for up to 4 rows at once)
static inline void lora_h16(const uint16_t *A, int64_t rank, const float *x, int64_t K, float sc,
                     float *h) {
    int64_t r = 0;
#if defined(__AVX2__)
    for (; r + 4 <= rank; r += 4) {
        const uint16_t *w0 = A + r * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) {
            // the next 4 rows (4 K halves, contiguous after these) a line per 8 columns:
            // one row's stream is too short for the hardware prefetcher to ramp up
            __builtin_prefetch(w3 + K + 4 * k, 0, 0);
            const __m256 xv = _mm256_loadu_ps(x + k);
            a0 = madd8(ld16x8(w0 + k), xv, a0);
            a1 = madd8(ld16x8(w1 + k), xv, a1);
            a2 = madd8(ld16x8(w2 + k), xv, a2);
            a3 = madd8(ld16x8(w3 + k), xv, a3);
        }
        float t0 = hsum8(a0), t1 = hsum8(a1), t2 = hsum8(a2), t3 = hsum8(a3);
        for (; k < K; k++) {
            t0 += h2f(w0 + k) * x[k];
            t1 += h2f(w1 + k) * x[k];
            t2 += h2f(w2 + k) * x[k];
            t3 += h2f(w3 + k) * x[k];
        }
        h[r] = t0 * sc;
        h[r + 1] = t1 * sc;
        h[r + 2] = t2 * sc;
        h[r + 3] = t3 * sc;
    }
#endif
    for (; r < rank; r++) h[r] = dot16(A + r * K, x, K) * sc;
}

// floatmm.c's lora_b through B in tiles of 8 outputs, bt [N / 8, r, 8] in halves (tile o / 8
// holds B[o..o+7, j] at j * 8 + lane): the 8 lanes of one vector per rank as there, but one
// sequential stream instead of r strided ones; the outputs past the last whole tile from
// the tail [N - N / 8 * 8, r] in halves, dot_f's operations on them (dot16). lo must be a
// multiple of 8.
static void lora_b16(const uint16_t *bt, const uint16_t *tail, int64_t r, int64_t N,
                     const float *h, float *y, int64_t lo, int64_t hi) {
    const int64_t n8 = N / 8 * 8;
    int64_t o = lo;
#if defined(__AVX2__)
    for (; o + 8 <= hi; o += 8) b16_tile(bt + o * r, r, h, y + o);  // (o / 8) * r * 8
#endif
    // without AVX2, dot_f is a plain chain over the rank: the same on a tile's column
    for (; o < hi && o < n8; o++) {
        const uint16_t *col = bt + (o / 8) * r * 8 + o % 8;
        float acc = 0.0f;
        for (int64_t k = 0; k < r; k++) acc += h2f(col + k * 8) * h[k];
        y[o] += acc;
    }
    for (; o < hi; o++) y[o] += dot16(tail + (o - n8) * r, h, r);
}

// ls_lora with each adapter's A [r_a, K] as float16 (as16) and B as float16 too: 8-output
// tiles [N / 8, r_a, 8] (bt16s) and the tail's rows [N - N / 8 * 8, r_a] (tails; unread when
// N is a multiple of 8): the same arguments otherwise, the same bits (each output's
// operations do not depend on which column range computes it, so the ranges start at
// multiples of 8, on whole tiles, nor on which rows share a group: lora16_rows.h).
//
// The rows are grouped by adapter, as Punica's and S-LoRA's SGMV kernels group them: the
// shrinks run per (adapter, up to 4 of its rows), each A vector widened once for them; the
// expands per block of rows (T / threads, at most 8), each adding its rows' adapters in
// order, sweeping each B whole (one stream; sweeping it in column ranges row by row was
// slower). A step of rows on many adapters reads each from memory: every work item asks
// for the next one's weights while it runs (Zen 4, Gemma 270M's 126 targets, 8 rows, 2
// threads, L3 flushed between steps, wall ms a step, medians: 8 rows on 8 rank-8/16
// adapters 2.41-2.44 before, 2.21-2.23 after; on 5 adapters 2.02-2.08, 1.91-1.92; on one
// adapter unchanged within the noise; a 128-row prefill on 8 adapters 17.3, 14.0).
int ls_lora16(int n_ad, const uint16_t *const *as16, const uint16_t *const *tails,
              const uint16_t *const *bt16s, const int64_t *ranks, const float *s,
              const float *x, int64_t ldx, int64_t T, int64_t K, float *y, int64_t ldy,
              int64_t N, int nthreads) {
    if (n_ad < 0 || T < 0 || K < 0 || N < 0 || ldx < K || ldy < N) return -3;
    int64_t work = 0;
    for (int a = 0; a < n_ad; a++) {
        if (ranks[a] < 0 || as16[a] == NULL || bt16s[a] == NULL || (N % 8 && tails[a] == NULL))
            return -3;
        work += ranks[a] * (K + N);
    }
    if (work * T < (1 << 17)) nthreads = 1;
    // off[t * n_ad + a]: row t's h for adapter a; rows[]: each adapter's rows in order,
    // from first[a]; items[]: the shrinks' (adapter, first row index, count)
    const int64_t nta = T * n_ad;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(2 * nta + 3 * nta + n_ad + 2));
    if (off == NULL) return -2;
    int64_t *rows = off + nta, *first = rows + nta, *items = first + n_ad + 1, used = 0;
    for (int64_t t = 0; t < T; t++)
        for (int a = 0; a < n_ad; a++) {
            off[t * n_ad + a] = used;
            if (s[a * T + t] != 0.0f) used += ranks[a];
        }
    int64_t n_rows = 0, n_items = 0;
    for (int a = 0; a < n_ad; a++) {
        first[a] = n_rows;
        for (int64_t t = 0; t < T; t++)
            if (s[a * T + t] != 0.0f) rows[n_rows++] = t;
        for (int64_t i = first[a]; i < n_rows; i += 4) {
            items[3 * n_items] = a;
            items[3 * n_items + 1] = i;
            items[3 * n_items + 2] = n_rows - i < 4 ? n_rows - i : 4;
            n_items++;
        }
    }
    first[n_ad] = n_rows;
    float *h = malloc(sizeof(float) * (size_t)(used + 1));
    if (h == NULL) {
        free(off);
        return -2;
    }
    // the expands' items: blocks of rows, each sweeping its adapters' B whole (one stream
    // each: sweeping it in column ranges row by row was slower); with fewer rows than
    // threads, one row each over column ranges
    const int64_t per_thread = (T + nthreads - 1) / (nthreads > 0 ? nthreads : 1);
    const int64_t br = T >= nthreads ? (per_thread < 8 ? per_thread : 8) : 1;
    const int64_t n_blocks = (T + br - 1) / br, n_parts = T >= nthreads ? 1 : nthreads;
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int64_t it = 0; it < n_items; it++) {
            const int a = (int)items[3 * it];
            const int64_t i0 = items[3 * it + 1], m = items[3 * it + 2];
            const float *xs[4];
            float *hs[4];
            float sc[4];
            for (int64_t q = 0; q < m; q++) {
                const int64_t t = rows[i0 + q];
                xs[q] = x + t * ldx;
                hs[q] = h + off[t * n_ad + a];
                sc[q] = s[a * T + t];
            }
#if defined(__AVX2__)
            const char *pf = NULL;  // the next item's A, unless it is this one's
            int64_t pf_lines = 0;
            if (it + 1 < n_items && items[3 * (it + 1)] != a) {
                pf = (const char *)as16[items[3 * (it + 1)]];
                pf_lines = (ranks[items[3 * (it + 1)]] * K * 2 + 63) / 64;
            }
            switch (m) {
            case 1: h_rows(as16[a], ranks[a], xs, K, sc, hs, 1, pf, pf_lines); break;
            case 2: h_rows(as16[a], ranks[a], xs, K, sc, hs, 2, pf, pf_lines); break;
            case 3: h_rows(as16[a], ranks[a], xs, K, sc, hs, 3, pf, pf_lines); break;
            default: h_rows(as16[a], ranks[a], xs, K, sc, hs, 4, pf, pf_lines); break;
            }
#else
            for (int64_t q = 0; q < m; q++) lora_h16(as16[a], ranks[a], xs[q], K, sc[q], hs[q]);
#endif
        }
#pragma omp for schedule(static) collapse(2)
        for (int64_t blk = 0; blk < n_blocks; blk++)
            for (int64_t part = 0; part < n_parts; part++) {
                const int64_t lo = N * part / n_parts / 8 * 8;
                const int64_t hi = part == n_parts - 1 ? N : N * (part + 1) / n_parts / 8 * 8;
                const int64_t t0 = blk * br, t1 = t0 + br < T ? t0 + br : T;
                for (int a = 0; a < n_ad; a++) {
                    // this block's rows of adapter a: rows[first[a] .. ) from t0 on
                    int64_t i = first[a], e = first[a + 1];
                    while (i < e && rows[i] < t0) i++;
                    int64_t j = i;
                    while (j < e && rows[j] < t1) j++;
                    if (i == j) continue;
#if defined(__AVX2__)
                    const int64_t n8 = N / 8 * 8, whole = hi < n8 ? hi : n8;
                    const char *pf = NULL;  // the next adapter's tiles of these columns
                    int64_t pf_lines = 0;
                    for (int b = a + 1; b < n_ad && pf == NULL; b++)
                        for (int64_t t = t0; t < t1; t++)
                            if (s[b * T + t] != 0.0f) {
                                pf = (const char *)(bt16s[b] + lo * ranks[b]);
                                pf_lines = ((whole - lo) * ranks[b] * 2 + 63) / 64;
                                break;
                            }
                    for (; i < j; i++) {  // the next adapter's lines during the first row
                        const float *hq = h + off[rows[i] * n_ad + a];
                        float *yq = y + rows[i] * ldy;
                        b_row(bt16s[a], ranks[a], hq, yq, lo, whole, pf, pf_lines);
                        pf = NULL;
                        pf_lines = 0;
                        if (whole < hi)  // the tail: lora_b16's own loop
                            lora_b16(bt16s[a], tails[a], ranks[a], N, hq, yq, whole, hi);
                    }
#else
                    for (; i < j; i++)
                        lora_b16(bt16s[a], tails[a], ranks[a], N,
                                 h + off[rows[i] * n_ad + a], y + rows[i] * ldy, lo, hi);
#endif
                }
            }
    }
    free(h);
    free(off);
    return 0;
}

#include "lora16_hold.h"  // ls_lora16_hold: an adapter's halves copied into their held form
