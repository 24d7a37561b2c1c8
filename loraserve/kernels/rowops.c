// Row-wise operations in one call each: RMSNorm (plain and per head), LayerNorm, rope, the
// gated activation and logit soft-capping (the pass over a step's logits: logits_scan.c).
//
// A torch RMSNorm is six dispatches (~25 us at one row, 90 a Gemma decode step); this is
// one. Each output row depends on its own input row only, with a fixed summation order.

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include "simd.h"

static inline float sum_squares(const float *x, int64_t K) {
    int64_t k = 0;
    float r = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k);
        acc = _mm256_add_ps(_mm256_mul_ps(v, v), acc);
    }
    r = hsum8(acc);
#endif
    for (; k < K; k++) r += x[k] * x[k];
    return r;
}

// y[t, h] = x[t, h] / sqrt(mean(x[t, h]^2) + eps) * w[h % HW] for T tokens of H rows of K
// values: x[t, h, k] at x + t * ldt + h * K, y contiguous [T, H, K]; w: HW rows of K.
int ls_rms_norm(const float *x, int64_t T, int64_t H, int64_t K, int64_t ldt, const float *w,
                int64_t HW, float eps, float *y, int nthreads) {
    if (T < 0 || H < 1 || K < 1 || HW < 1 || (T > 1 && ldt < H * K)) return -3;
    if (T * H * K < (1 << 16)) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < T * H; r++) {
        const int64_t t = r / H, h = r % H;
        const float *xr = x + t * ldt + h * K, *wr = w + (h % HW) * K;
        float *yr = y + r * K;
        const float inv = 1.0f / sqrtf(sum_squares(xr, K) / (float)K + eps);
        for (int64_t k = 0; k < K; k++) yr[k] = (xr[k] * inv) * wr[k];
    }
    return 0;
}

// sum of x[k] (or of (x[k] - m)^2 when sq) in one fixed order: 8-lane partial sums, their
// fixed horizontal sum, then the K % 8 tail in order
static inline float row_sum(const float *x, int64_t K, float m, int sq) {
    int64_t k = 0;
    float r = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps(), vm = _mm256_set1_ps(m);
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k);
        if (sq) {
            v = _mm256_sub_ps(v, vm);
            v = _mm256_mul_ps(v, v);
        }
        acc = _mm256_add_ps(acc, v);
    }
    r = hsum8(acc);
#endif
    for (; k < K; k++) r += sq ? (x[k] - m) * (x[k] - m) : x[k];
    return r;
}

// LayerNorm (cohere2, and every "norm" of llama.cpp's LLM_NORM): y[t] = (x[t] - mean) /
// sqrt(var + eps) * w (+ b), mean and (biased) variance over the row's K values. x rows at
// stride ldt, y contiguous [T, K]; b may be NULL.
int ls_layer_norm(const float *x, int64_t T, int64_t K, int64_t ldt, const float *w,
                  const float *b, float eps, float *y, int nthreads) {
    if (T < 0 || K < 1 || (T > 1 && ldt < K)) return -3;
    if (T * K < (1 << 16)) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * ldt;
        float *yr = y + t * K;
        const float mean = row_sum(xr, K, 0.0f, 0) / (float)K;
        const float inv = 1.0f / sqrtf(row_sum(xr, K, mean, 1) / (float)K + eps);
        for (int64_t k = 0; k < K; k++) {
            const float v = ((xr[k] - mean) * inv) * w[k];
            yr[k] = b != NULL ? v + b[k] : v;
        }
    }
    return 0;
}

// Rotary embedding (halves rotated, as Hugging Face layouts expect), after an optional
// per-head RMSNorm: y[t, h] = rope(norm(x[t, h]) or x[t, h]) with cos/sin [T, K/2] of the
// token's position. x[t, h, k] at x + t * ldt + h * K; y contiguous [T, H, K]; w (HW rows
// of K) may be NULL for no norm.
int ls_norm_rope(const float *x, int64_t T, int64_t H, int64_t K, int64_t ldt, const float *w,
                 int64_t HW, float eps, const float *cos, const float *sin, float *y,
                 int nthreads) {
    if (T < 0 || H < 1 || K < 2 || K % 2 != 0 || HW < 1 || (T > 1 && ldt < H * K)) return -3;
    const int64_t half = K / 2;
    if (T * H * K < (1 << 16)) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < T * H; r++) {
        const int64_t t = r / H, h = r % H;
        const float *xr = x + t * ldt + h * K, *c = cos + t * half, *s = sin + t * half;
        float *yr = y + r * K;
        float inv = 1.0f;
        const float *wr = NULL;
        if (w != NULL) {
            inv = 1.0f / sqrtf(sum_squares(xr, K) / (float)K + eps);
            wr = w + (h % HW) * K;
        }
        for (int64_t k = 0; k < half; k++) {
            float a = xr[k], b = xr[k + half];
            if (wr != NULL) {
                a = (a * inv) * wr[k];
                b = (b * inv) * wr[k + half];
            }
            yr[k] = a * c[k] - b * s[k];
            yr[k + half] = b * c[k] + a * s[k];
        }
    }
    return 0;
}

// act(x) for 8 lanes: 0 = SiLU x / (1 + exp(-x)); 1 = GELU (tanh form)
// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as the equal x / (1 +
// exp(-2u)) (no cancellation where tanh(u) is near -1); 2 = gpt-oss's clamped SiLU
// (llama.cpp's swiglu_oai) x' / (1 + exp(-1.702 x')), x' = min(x, 7).
#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f
#if defined(__AVX2__)
static inline __m256 act8(__m256 x, int act) {
    __m256 z = x;
    if (act == 1) {
        __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                 _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(0.044715f), x3)));
        z = _mm256_add_ps(u, u);
    } else if (act == 2) {
        x = _mm256_min_ps(x, _mm256_set1_ps(OAI_LIMIT));
        z = _mm256_mul_ps(_mm256_set1_ps(OAI_ALPHA), x);
    }
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// the up half's factor: u, or for act 2 (swiglu_oai) clamp(u, -7, 7) + 1
static inline __m256 up8(__m256 u, int act) {
    if (act != 2) return u;
    const __m256 lim = _mm256_set1_ps(OAI_LIMIT);
    u = _mm256_min_ps(_mm256_max_ps(u, _mm256_sub_ps(_mm256_setzero_ps(), lim)), lim);
    return _mm256_add_ps(u, _mm256_set1_ps(1.0f));
}
#endif

// act(x) * up(u) for one value, by the vector formula on one lane where there is AVX2:
// every value gets the same operations wherever it lies
static inline float gated1(float x, float u, int act) {
#if defined(__AVX2__)
    float b[8] = {x, 0, 0, 0, 0, 0, 0, 0}, c[8] = {u, 0, 0, 0, 0, 0, 0, 0};
    __m256 r = _mm256_mul_ps(act8(_mm256_loadu_ps(b), act), up8(_mm256_loadu_ps(c), act));
    _mm256_storeu_ps(b, r);
    return b[0];
#else
    float z = x;
    if (act == 1) {
        float v = 0.7978845608028654f * (x + 0.044715f * ((x * x) * x));
        z = v + v;
    } else if (act == 2) {
        x = x < OAI_LIMIT ? x : OAI_LIMIT;
        z = OAI_ALPHA * x;
        u = (u < -OAI_LIMIT ? -OAI_LIMIT : u > OAI_LIMIT ? OAI_LIMIT : u) + 1.0f;
    }
    return x / (1.0f + expf(-z)) * u;
#endif
}

// out[t, f] = act(g[t * ld + f]) * up(u[t * ld + f]) for T rows of F (the gate and up halves
// of a fused projection's output, row stride ld); out contiguous [T, F]. act: 0 SiLU, 1
// GELU-tanh, 2 swiglu_oai (whose up factor is clamp(u, -7, 7) + 1; u itself otherwise).
int ls_gated_act(const float *g, const float *u, int64_t T, int64_t F, int64_t ld, int act,
                 float *out, int nthreads) {
    if (T < 0 || F < 0 || (T > 1 && ld < F)) return -3;
    if (T * F < (1 << 16)) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *gr = g + t * ld, *ur = u + t * ld;
        float *o = out + t * F;
        int64_t f = 0;
#if defined(__AVX2__)
        for (; f + 8 <= F; f += 8)
            _mm256_storeu_ps(o + f, _mm256_mul_ps(act8(_mm256_loadu_ps(gr + f), act),
                                                  up8(_mm256_loadu_ps(ur + f), act)));
#endif
        for (; f < F; f++) o[f] = gated1(gr[f], ur[f], act);
    }
    return 0;
}

// Logit soft-capping in place: x[r * ld + v] = cap * tanh(x / cap) for R rows of V values
// (gemma2's final logits). Each value by tanh8's formula, wherever it lies.
int ls_softcap(float *x, int64_t R, int64_t V, int64_t ld, float cap, int nthreads) {
    if (R < 0 || V < 0 || (R > 1 && ld < V)) return -3;
    const float inv = 1.0f / cap;
    if (R * V < (1 << 15)) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < R; r++) {
        float *xr = x + r * ld;
        int64_t v = 0;
#if defined(__AVX2__)
        const __m256 vc = _mm256_set1_ps(cap), vi = _mm256_set1_ps(inv);
        for (; v + 8 <= V; v += 8) {
            __m256 y = _mm256_mul_ps(_mm256_loadu_ps(xr + v), vi);
            _mm256_storeu_ps(xr + v, _mm256_mul_ps(vc, tanh8(y)));
        }
#endif
        for (; v < V; v++) xr[v] = cap * tanh1(xr[v] * inv);
    }
    return 0;
}
