// Activation quantization, per row (each row's integers and scales depend on that row alone):
// blocks of 32 for the legacy types (llama.cpp's Q8_0), of 256 for the K-quants (its Q8_K,
// which kquant.h's integer super-block dot products read).
//
// The numbers are ggml-cpu's own (x86 quantize_row_q8_0, quantize_row_q8_K_ref): q =
// round-half-to-even(x * id) with id = 127 / amax; Q8_0 keeps d = amax / 127 rounded to fp16
// (its block stores an fp16 scale), Q8_K d = 1 / id in float32 (its -127 / max with the
// sign folded in gives the same q * d). Measured on the recorded tiny models (issue 27):
// with llama.cpp's f16 attention emulated, matching these moved the median log-probability
// difference from llama-server from 0.036 to 0.004 (Q8_0) and 0.025 to 0.005 (Q4_K_M);
// the random stdev-0.5 weights amplify every rounding that differs.

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "f16.h"

// The block's scale from its amax: Q8_0 (k == 0) fp16(amax / 127), Q8_K (k == 1) 1 / id
static inline float block_scale(float amax, float id, int k) {
    if (id == 0.0f) return 0.0f;
    return k ? 1.0f / id : round_f16(amax / 127.0f);
}

// One block of n values (n a multiple of 16): q = rint(x * id), id = 127 / amax (ties to
// even, as ggml), sums[j] the sum of q over values 16j..16j+15 (exact). Returns the scale
// (`block_scale`), or NaN when the block holds a non-finite value (then q = 0): the
// matmul's output is non-finite too, never silently finite.
static float quantize_block_scalar(const float *xb, int n, int8_t *q, int *sums, int k) {
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        float a = fabsf(xb[i]);
        bad |= !isfinite(a);
        amax = a > amax ? a : amax;
    }
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f, dd = block_scale(amax, id, k);
    for (int j = 0; j < n / 16; j++) {
        int s = 0;
        for (int i = 16 * j; i < 16 * j + 16; i++) {
            int v = bad ? 0 : (int)rintf(xb[i] * id);
            q[i] = (int8_t)v;
            s += v;
        }
        sums[j] = s;
    }
    return bad ? NAN : dd;
}

#if defined(__AVX2__)
#include <immintrin.h>
// The same numbers 16 values at a time: amax is a maximum (any order), x * id the same float
// product, rounded to nearest even as rintf (the default rounding mode).
static float quantize_block(const float *xb, int n, int8_t *q, int *sums, int k) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 fmax = _mm256_set1_ps(3.402823466e38f);
    __m256 amax8 = _mm256_setzero_ps(), bad8 = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + i), absm);
        bad8 = _mm256_or_ps(bad8, _mm256_cmp_ps(a, fmax, _CMP_NLE_UQ));  // inf or NaN
        amax8 = _mm256_max_ps(amax8, a);
    }
    if (_mm256_movemask_ps(bad8)) return quantize_block_scalar(xb, n, q, sums, k);
    float m8[8], amax = 0.0f;
    _mm256_storeu_ps(m8, amax8);
    for (int l = 0; l < 8; l++) amax = m8[l] > amax ? m8[l] : amax;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f, dd = block_scale(amax, id, k);
    const __m256 vid = _mm256_set1_ps(id);
    for (int j = 0; j < n / 16; j++) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xb + 16 * j + 8 * h), vid);
            v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r[h] = _mm256_cvttps_epi32(v);
        }
        // 16 int32 -> 16 int8 in order (packs works per 128-bit lane: fix the lane order)
        __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(r[0], r[1]), 0xD8);
        __m128i p8 = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
        _mm_storeu_si128((__m128i *)(q + 16 * j), p8);
        __m256i s = _mm256_add_epi32(r[0], r[1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        sums[j] = _mm_cvtsi128_si32(_mm_hadd_epi32(s4, s4));
    }
    return dd;
}
#else
#define quantize_block quantize_block_scalar
#endif

// Legacy-type activations: x [M, K] (row stride ldx) -> q [M, K] int8, d [M, K/32] scales
// (llama.cpp's Q8_0), ms [M, K/16] = d * sum(q) over each 16, bs [M, K/32] the sums of q
// over each 32 (what packed Q5_0 / Q4_0 read; bs may be NULL).
int ls_quantize_rows(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                     float *ms, int16_t *bs, int nthreads) {
    if (M < 0 || K < 0 || (M > 1 && ldx < K)) return -3;
    if (M * K < (1 << 16)) nthreads = 1;  // a few rows: waking a thread costs more
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < K / 32; b++) {
            int sums[2];
            const float dd = quantize_block(x + m * ldx + 32 * b, 32, q + m * K + 32 * b, sums, 0);
            d[m * (K / 32) + b] = dd;
            ms[m * (K / 16) + 2 * b] = dd * (float)sums[0];
            ms[m * (K / 16) + 2 * b + 1] = dd * (float)sums[1];
            if (bs != NULL) bs[m * (K / 32) + b] = (int16_t)(sums[0] + sums[1]);
        }
    return 0;
}

// K-quant activations: x [M, K] -> q [M, K] int8, d [M, K/256], bs16 [M, K/16] and bs32
// [M, K/32] (the sums of q per 16 / 32), as kquant.h describes.
int ls_quantize_rows_k(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                       int16_t *bs16, int16_t *bs32, int nthreads) {
    if (M < 0 || K < 0 || (M > 1 && ldx < K)) return -3;
    if (M * K < (1 << 16)) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < K / 256; b++) {
            int sums[16];
            d[m * (K / 256) + b] =
                quantize_block(x + m * ldx + 256 * b, 256, q + m * K + 256 * b, sums, 1);
            int16_t *b16 = bs16 + m * (K / 16) + 16 * b, *b32 = bs32 + m * (K / 32) + 8 * b;
            for (int j = 0; j < 16; j++) b16[j] = (int16_t)sums[j];
            for (int j = 0; j < 8; j++) b32[j] = (int16_t)(sums[2 * j] + sums[2 * j + 1]);
        }
    return 0;
}

