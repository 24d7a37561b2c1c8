// Float matmuls with one fixed summation order per output: F32/F16/BF16 weights, and the
// LoRA deltas of a step's adapters (each adapter reduced over its own rank only, adapters
// added in the order given), so every output row depends on its own input row alone.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_blocks.h"  // half_to_float, the type ids
#include "simd.h"

static void to_float_row(int type, const uint8_t *r, int64_t K, float *out) {
    if (type == T_F16) {
        for (int64_t k = 0; k < K; k++) out[k] = half_to_float(r + 2 * k);
    } else {  // BF16
        for (int64_t k = 0; k < K; k++) {
            uint16_t h;
            memcpy(&h, r + 2 * k, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(out + k, &bits, 4);
        }
    }
}

static inline float dot_f(const float *w, const float *x, int64_t K) {
    int64_t k = 0;
    float r = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) acc = madd8(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), acc);
    r = hsum8(acc);
#endif
    for (; k < K; k++) r += w[k] * x[k];
    return r;
}

// y [M, N] (row stride ldy) = x [M, K] (row stride ldx) x weight rows w [N, K] of type F32,
// F16 or BF16 (row stride ldw_bytes). Returns 0, -1 for another type, -3 for sizes that do
// not fit.
int ls_fmatmul(int type, const uint8_t *w, int64_t N, int64_t K, int64_t ldw_bytes,
               const float *x, int64_t ldx, int64_t M, float *y, int64_t ldy, int nthreads) {
    if (type != T_F32 && type != T_F16 && type != T_BF16) return -1;
    if (N < 0 || K < 0 || M < 0 || ldw_bytes < K * (type == T_F32 ? 4 : 2) || ldx < K || ldy < N)
        return -3;  // sizes that do not fit: rows shorter than K, outputs past y's rows
    if (N * K * M < (1 << 16)) nthreads = 1;  // LoRA's small products: no thread wake-up
#pragma omp parallel num_threads(nthreads)
    {
        float *buf = type == T_F32 ? NULL : malloc(sizeof(float) * (size_t)(K > 0 ? K : 1));
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *wr = (const float *)(w + n * ldw_bytes);
            if (buf != NULL) {
                to_float_row(type, w + n * ldw_bytes, K, buf);
                wr = buf;
            }
            for (int64_t m = 0; m < M; m++) y[m * ldy + n] = dot_f(wr, x + m * ldx, K);
        }
        free(buf);
    }
    return 0;
}

// y[lo..hi) += B h with B [N, r] (row stride r), one dot_f per output; bt (may be NULL):
// the same B transposed, [r, N], which lets 8 outputs run as the 8 lanes of one vector with,
// per output, exactly dot_f's operations (lane-i products fused-accumulated over the rank,
// hsum8's tree over the 8 partial sums, then the tail): the same bits, ~3x fewer ops.
static void lora_b(const float *b, const float *bt, int64_t r, int64_t N, const float *h,
                   float *y, int64_t lo, int64_t hi) {
    int64_t o = lo;
#if defined(__AVX2__)
    if (bt != NULL) {
        const int64_t r8 = r / 8 * 8;
        for (; o + 8 <= hi; o += 8) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
                   a6 = a0, a7 = a0;
#define LS_LANE(i, acc) \
    acc = madd8(_mm256_loadu_ps(bt + (j + (i)) * N + o), _mm256_broadcast_ss(h + j + (i)), acc)
            for (int64_t j = 0; j < r8; j += 8) {
                LS_LANE(0, a0);
                LS_LANE(1, a1);
                LS_LANE(2, a2);
                LS_LANE(3, a3);
                LS_LANE(4, a4);
                LS_LANE(5, a5);
                LS_LANE(6, a6);
                LS_LANE(7, a7);
            }
#undef LS_LANE
            // hsum8: (v_i + v_{i+4}), then (0 + 2) and (1 + 3), then their sum
            __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a4), _mm256_add_ps(a2, a6)),
                                       _mm256_add_ps(_mm256_add_ps(a1, a5), _mm256_add_ps(a3, a7)));
            for (int64_t k = r8; k < r; k++)
                sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_loadu_ps(bt + k * N + o),
                                                       _mm256_broadcast_ss(h + k)));
            _mm256_storeu_ps(y + o, _mm256_add_ps(_mm256_loadu_ps(y + o), sum));
        }
    }
#else
    (void)bt;
    (void)N;
#endif
    for (; o < hi; o++) y[o] += dot_f(b + o * r, h, r);
}

// h[r] = dot_f(A[r], x, K) * sc for r < rank (A [rank, K]): 4 ranks' chains side by side,
// each with exactly dot_f's operations, so the same bits as one at a time. One rank's dot
// product is one chain of dependent multiply-adds; four keep the core busy.
static void lora_h(const float *A, int64_t rank, const float *x, int64_t K, float sc, float *h) {
    int64_t r = 0;
#if defined(__AVX2__)
    for (; r + 4 <= rank; r += 4) {
        const float *w0 = A + r * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) {
            const __m256 xv = _mm256_loadu_ps(x + k);
            a0 = madd8(_mm256_loadu_ps(w0 + k), xv, a0);
            a1 = madd8(_mm256_loadu_ps(w1 + k), xv, a1);
            a2 = madd8(_mm256_loadu_ps(w2 + k), xv, a2);
            a3 = madd8(_mm256_loadu_ps(w3 + k), xv, a3);
        }
        float t0 = hsum8(a0), t1 = hsum8(a1), t2 = hsum8(a2), t3 = hsum8(a3);
        for (; k < K; k++) {
            t0 += w0[k] * x[k];
            t1 += w1[k] * x[k];
            t2 += w2[k] * x[k];
            t3 += w3[k] * x[k];
        }
        h[r] = t0 * sc;
        h[r + 1] = t1 * sc;
        h[r + 2] = t2 * sc;
        h[r + 3] = t3 * sc;
    }
#endif
    for (; r < rank; r++) h[r] = dot_f(A + r * K, x, K) * sc;
}

// y[t] += sum over adapters a (in order) of B_a (s[a, t] * (A_a x[t])), skipping rows whose
// scale for a is 0. x [T, K] (row stride ldx), y [T, N] (row stride ldy); A_a [r_a, K] and
// B_a [N, r_a] contiguous float32; s [n_ad, T]; bts NULL, or per adapter B_a transposed
// [r_a, N] (or NULL), a faster route to the same bits. h = A_a x[t] is scaled then
// multiplied by B_a exactly as fmatmul would (dot_f's operations), so this equals the
// per-adapter products.
int ls_lora(int n_ad, const float *const *as, const float *const *bs, const float *const *bts,
            const int64_t *ranks, const float *s, const float *x, int64_t ldx, int64_t T,
            int64_t K, float *y, int64_t ldy, int64_t N, int nthreads) {
    if (n_ad < 0 || T < 0 || K < 0 || N < 0 || ldx < K || ldy < N) return -3;
    int64_t work = 0;
    for (int a = 0; a < n_ad; a++) {
        if (ranks[a] < 0) return -3;
        work += ranks[a] * (K + N);
    }
    if (work * T < (1 << 17)) nthreads = 1;
    // h of every (row, adapter) in the row's mix first, once (the 4 column ranges below all
    // read it): off[t * n_ad + a] is where it starts in h
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
                    lora_h(as[a], ranks[a], x + t * ldx, K, s[a * T + t], h + off[t * n_ad + a]);
#pragma omp for schedule(static) collapse(2)
        for (int64_t t = 0; t < T; t++)
            for (int64_t part = 0; part < 4; part++) {  // output columns split in 4 ranges
                const int64_t lo = N * part / 4, hi = N * (part + 1) / 4;
                for (int a = 0; a < n_ad; a++)
                    if (s[a * T + t] != 0.0f)
                        lora_b(bs[a], bts != NULL ? bts[a] : NULL, ranks[a], N,
                               h + off[t * n_ad + a], y + t * ldy, lo, hi);
            }
    }
    free(h);
    free(off);
    return 0;
}
