// Activation quantization, per row (each row's integers and scales depend on that row alone):
// blocks of 32 for the legacy types (llama.cpp's Q8_0), of 256 for the K-quants (its Q8_K,
// which kquant.h's integer super-block dot products read).

#include <math.h>
#include <stdint.h>

// Activations per row in blocks of 256: q int8, d = amax / 127 per block, bs16/bs32 the
// sums of q per 16 / 32 (exact). A non-finite block gets a NaN scale (the output is
// non-finite, never silently finite).
static void quantize_row_k(const float *x, int64_t K, int8_t *q, float *d, int16_t *bs16,
                           int16_t *bs32) {
    for (int64_t b = 0; b < K / 256; b++) {
        const float *xb = x + 256 * b;
        float amax = 0.0f;
        int bad = 0;
        for (int i = 0; i < 256; i++) {
            float a = fabsf(xb[i]);
            bad |= !isfinite(a);
            amax = a > amax ? a : amax;
        }
        float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) {
                int v = bad ? 0 : (int)roundf(xb[i] * id);
                q[256 * b + i] = (int8_t)v;
                s += v;
            }
            bs16[16 * b + j] = (int16_t)s;
        }
        for (int j = 0; j < 8; j++)
            bs32[8 * b + j] = (int16_t)(bs16[16 * b + 2 * j] + bs16[16 * b + 2 * j + 1]);
        d[b] = bad ? NAN : dd;
    }
}

// x [M, K] (row stride ldx) -> q [M, K] int8, d [M, K/32] scales, ms [M, K/16] = d * sum(q)
// over each 16. A block holding a non-finite value gets a NaN scale, so the matmul's output
// is non-finite too (never silently finite).
void ls_quantize_rows(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                      float *ms, int nthreads) {
    if (M * K < (1 << 16)) nthreads = 1;  // a few rows: waking a thread costs more
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * ldx;
        for (int64_t b = 0; b < K / 32; b++) {
            const float *xb = xr + 32 * b;
            float amax = 0.0f;
            int bad = 0;
            for (int i = 0; i < 32; i++) {
                float a = fabsf(xb[i]);
                bad |= !isfinite(a);
                amax = a > amax ? a : amax;
            }
            float dd = amax / 127.0f;
            float id = dd != 0.0f ? 1.0f / dd : 0.0f;
            int8_t *qb = q + m * K + 32 * b;
            int s0 = 0, s1 = 0;
            for (int i = 0; i < 32; i++) {
                int v = bad ? 0 : (int)roundf(xb[i] * id);
                qb[i] = (int8_t)v;
                if (i < 16) s0 += v; else s1 += v;
            }
            if (bad) dd = NAN;
            d[m * (K / 32) + b] = dd;
            ms[m * (K / 16) + 2 * b] = dd * (float)s0;
            ms[m * (K / 16) + 2 * b + 1] = dd * (float)s1;
        }
    }
}

// K-quant activations: x [M, K] -> q [M, K] int8, d [M, K/256], bs16 [M, K/16] and bs32
// [M, K/32] (the sums of q per 16 / 32), as kquant.h describes.
void ls_quantize_rows_k(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                        int16_t *bs16, int16_t *bs32, int nthreads) {
    if (M * K < (1 << 16)) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++)
        quantize_row_k(x + m * ldx, K, q + m * K, d + m * (K / 256), bs16 + m * (K / 16),
                       bs32 + m * (K / 32));
}

