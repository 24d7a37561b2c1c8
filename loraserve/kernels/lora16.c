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
#endif

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

// floatmm.c's lora_h: h[r] = dot(A[r], x) * sc, 4 ranks' chains side by side
static void lora_h16(const uint16_t *A, int64_t rank, const float *x, int64_t K, float sc,
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
    const int64_t r8 = r / 8 * 8;
    for (; o + 8 <= hi; o += 8) {
        const uint16_t *tile = bt + o * r;  // (o / 8) * r * 8
        __builtin_prefetch(tile + 4 * r * 8, 0, 0);  // 4 tiles on: hints, no bit changes
        __builtin_prefetch(tile + 4 * r * 8 + 32, 0, 0);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
               a7 = a0;
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
            sum = _mm256_add_ps(sum, _mm256_mul_ps(ld16x8(tile + k * 8),
                                                   _mm256_broadcast_ss(h + k)));
        _mm256_storeu_ps(y + o, _mm256_add_ps(_mm256_loadu_ps(y + o), sum));
    }
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
// multiples of 8, on whole tiles).
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
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(T * n_ad + 1)), used = 0;
    if (off == NULL) return -2;
    for (int64_t t = 0; t < T; t++)
        for (int a = 0; a < n_ad; a++) {
            off[t * n_ad + a] = used;
            if (s[a * T + t] != 0.0f) used += ranks[a];
        }
    float *h = malloc(sizeof(float) * (size_t)(used + 1));
    if (h == NULL) {
        free(off);
        return -2;
    }
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static) collapse(2)
        for (int64_t t = 0; t < T; t++)
            for (int a = 0; a < n_ad; a++)
                if (s[a * T + t] != 0.0f)
                    lora_h16(as16[a], ranks[a], x + t * ldx, K, s[a * T + t],
                             h + off[t * n_ad + a]);
#pragma omp for schedule(static) collapse(2)
        for (int64_t t = 0; t < T; t++)
            for (int64_t part = 0; part < 4; part++) {  // output columns split in 4 ranges
                const int64_t lo = N * part / 32 * 8;
                const int64_t hi = part == 3 ? N : N * (part + 1) / 32 * 8;
                for (int a = 0; a < n_ad; a++)
                    if (s[a * T + t] != 0.0f)
                        lora_b16(bt16s[a], tails[a], ranks[a], N, h + off[t * n_ad + a],
                                 y + t * ldy, lo, hi);
            }
    }
    free(h);
    free(off);
    return 0;
}
