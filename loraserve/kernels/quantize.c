// Activation quantization, per row (each row's integers and scales depend on that row alone):
// blocks of 32 for the legacy types (llama.cpp's Q8_0), of 256 for the K-quants (its Q8_K,
// which kquant.h's integer super-block dot products read).

#include <math.h>
#include <stdint.h>

// One block of n values (n a multiple of 16): q = round(x / d) with d = amax / 127 (round
// half away from zero, as ggml), sums[j] the sum of q over values 16j..16j+15 (exact).
// Returns d, or NaN when the block holds a non-finite value (then q = 0): the matmul's
// output is non-finite too, never silently finite.
static float quantize_block(const float *xb, int n, int8_t *q, int *sums) {
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        float a = fabsf(xb[i]);
        bad |= !isfinite(a);
        amax = a > amax ? a : amax;
    }
    float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    for (int j = 0; j < n / 16; j++) {
        int s = 0;
        for (int i = 16 * j; i < 16 * j + 16; i++) {
            int v = bad ? 0 : (int)roundf(xb[i] * id);
            q[i] = (int8_t)v;
            s += v;
        }
        sums[j] = s;
    }
    return bad ? NAN : dd;
}

// Legacy-type activations: x [M, K] (row stride ldx) -> q [M, K] int8, d [M, K/32] scales
// (llama.cpp's Q8_0), ms [M, K/16] = d * sum(q) over each 16.
void ls_quantize_rows(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                      float *ms, int nthreads) {
    if (M * K < (1 << 16)) nthreads = 1;  // a few rows: waking a thread costs more
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < K / 32; b++) {
            int sums[2];
            const float dd = quantize_block(x + m * ldx + 32 * b, 32, q + m * K + 32 * b, sums);
            d[m * (K / 32) + b] = dd;
            ms[m * (K / 16) + 2 * b] = dd * (float)sums[0];
            ms[m * (K / 16) + 2 * b + 1] = dd * (float)sums[1];
        }
}

// K-quant activations: x [M, K] -> q [M, K] int8, d [M, K/256], bs16 [M, K/16] and bs32
// [M, K/32] (the sums of q per 16 / 32), as kquant.h describes.
void ls_quantize_rows_k(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                        int16_t *bs16, int16_t *bs32, int nthreads) {
    if (M * K < (1 << 16)) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < K / 256; b++) {
            int sums[16];
            d[m * (K / 256) + b] =
                quantize_block(x + m * ldx + 256 * b, 256, q + m * K + 256 * b, sums);
            int16_t *b16 = bs16 + m * (K / 16) + 16 * b, *b32 = bs32 + m * (K / 32) + 8 * b;
            for (int j = 0; j < 16; j++) b16[j] = (int16_t)sums[j];
            for (int j = 0; j < 8; j++) b32[j] = (int16_t)(sums[2 * j] + sums[2 * j + 1]);
        }
}

