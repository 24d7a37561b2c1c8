// 8-lane float helpers shared by the kernels, each with one fixed order of operations.

#pragma once

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
#endif
