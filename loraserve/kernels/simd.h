// 8-lane float helpers shared by the kernels, each with one fixed order of operations,
// and the read-ahead hint of the decode rows' weight streams.

#pragma once

// The dot products of a decode step (at most 4 activation rows against a weight row read
// in place) ask for the weight bytes PREFETCH_AHEAD past where they read, a line or so per
// step of their loop: each output is one serial chain of multiply-adds, and between the
// chains the hardware prefetcher alone kept too few reads in flight. Measured (Zen 2, 2
// threads, interleaved runs): decode steps (means of 60-150) Gemma 270M 17.2 -> 13.2 ms,
// 1B (random weights) 54.9 -> 42.2 ms, 4B 137 -> 106 ms; 4-row steps 270M 25.7 -> 23.9 ms,
// 1B 84.0 -> 79.7 ms; Gemma 270M's 168 MB Q8_0 output matrix alone 8.5 -> 6.9 ms (26 GB/s,
// what this machine streams). Any distance from 1 to 8 KB did about as well. Asking for a
// whole row before its dot product (bursts of 11+ lines) gained less, and 4 rows' worth
// before a tile of 4 was 40% slower: the bursts fill the miss buffers. 512-token prefills
// are unchanged. Hints only: they change no bit.
#define PREFETCH_AHEAD 2048
#define PREFETCH(p) __builtin_prefetch((const char *)(p) + PREFETCH_AHEAD, 0, 0)

#include <math.h>

// a * b + c as madd8 computes each lane (fused where the CPU has FMA)
static inline float madd1(float a, float b, float c) {
#if defined(__FMA__)
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

#if defined(__AVX2__)
#include <immintrin.h>

// The lanes' sum in one fixed order: (0+4, 1+5, 2+6, 3+7), then pairs, then the two.
static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

// a * b + c: fused where the CPU has FMA (the build is for one CPU, so always the same)
static inline __m256 madd8(__m256 a, __m256 b, __m256 c) {
#if defined(__FMA__)
    return _mm256_fmadd_ps(a, b, c);
#else
    return _mm256_add_ps(_mm256_mul_ps(a, b), c);
#endif
}

// exp of 8 lanes for x <= 88 (Cephes' expf polynomial, about 1 ulp): x < -87 gives 0, NaN
// stays NaN. Lane-wise arithmetic only, so a value's result never depends on its lane.
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 fx = _mm256_floor_ps(madd8(xc, _mm256_set1_ps(1.44269504088896341f),
                                      _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_sub_ps(xc, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = madd8(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = madd8(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = madd8(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = madd8(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = madd8(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = madd8(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y);         // underflow: 0
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN stays NaN
}

// tanh of 8 lanes as 1 - 2 / (1 + exp(2y)): exp8 saturates, so a large |y| gives +-1, never
// NaN (NaN stays NaN). Absolute error ~1e-7 (logit soft-capping: attention and output).
static inline __m256 tanh8(__m256 y) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp8(_mm256_add_ps(y, y));
    return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, e)));
}
#endif

// tanh8's formula for one value (its lane arithmetic where there is AVX2), so a value gets
// the same bits wherever it lies in a vector or a tail
static inline float tanh1(float y) {
#if defined(__AVX2__)
    float b[8] = {y, 0, 0, 0, 0, 0, 0, 0};
    _mm256_storeu_ps(b, tanh8(_mm256_loadu_ps(b)));
    return b[0];
#else
    return 1.0f - 2.0f / (1.0f + expf(y + y));
#endif
}
