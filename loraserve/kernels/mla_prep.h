// Latent attention's rows around its attention kernel (deepseek2, model/attn/mla.py), in one
// call per layer instead of ~15 tensor operations (included by attention.c, same unit).
//
// Per token t of T: the query rows the attention reads, qa[t, h] = [kb[t, h] | rope(q_pe)]
// (rank + R floats a head), and the token's compressed cache row at slot slots[t],
// [RMSNorm(kv[t, :rank]) * w | rope(k_pe)] (float32, or rounded to f16 ties-to-even as
// torch's .to(float16) does), where q_pe is the last R of head h's qd query values and k_pe
// the last R of kv's row, each read in the order perm (adjacent pairs to halves: perm[j] is
// the column of halves-order position j), then rotated as halves with the token's cos/sin
// [T, R/2]. The same float operations as the tensor path (mla.py's `_prep_torch`): the RMSNorm
// is rowops.c's own call, the rotation rowops.c's statements (a * c - b * s, b * c + a * s,
// no contraction under -ffp-contract=off), so the same bits.

#include <string.h>

#include "f16.h"

int ls_rms_norm(const float *x, int64_t T, int64_t H, int64_t K, int64_t ldt, const float *w,
                int64_t HW, float eps, float *y, int nthreads);

// x[perm[j]] for j < R rotated as halves by c/s [R/2] into y [R]
static inline void mla_rope(const float *x, const int64_t *perm, int64_t R, const float *c,
                            const float *s, float *y) {
    const int64_t half = R / 2;
    for (int64_t k = 0; k < half; k++) {
        const float a = x[perm[k]], b = x[perm[k + half]];
        y[k] = a * c[k] - b * s[k];
        y[k + half] = b * c[k] + a * s[k];
    }
}

// q [T, ldq] (head h's qd values at h * qd), kv [T, ldkv] (rank + R), kb [T, H, rank] at
// strides kb_t, kb_h (unit stride within a head), cos/sin [T, R/2], slots [T] into a pool of
// S rows of ldc elements (f16: uint16 halves, else floats), w [rank]; qa [T, H, rank + R]
// contiguous. Returns 0, -3 for sizes or slots that do not fit (nothing written), -2 when
// out of memory.
int ls_mla_prep(const float *q, int64_t ldq, const float *kv, int64_t ldkv, const float *kb,
                int64_t kb_t, int64_t kb_h, int64_t T, int64_t H, int64_t qd, int64_t rank,
                int64_t R, const int64_t *perm, const float *w, float eps, const float *cos,
                const float *sin, const int64_t *slots, int64_t S, void *cache, int64_t ldc,
                int f16, float *qa, int nthreads) {
    const int64_t D = rank + R, half = R / 2;
    if (T < 0 || H < 1 || rank < 1 || R < 2 || R % 2 != 0 || qd < R || ldq < H * qd ||
        ldkv < D || ldc < D || kb_h < rank)
        return -3;
    for (int64_t j = 0; j < R; j++)
        if (perm[j] < 0 || perm[j] >= R) return -3;
    for (int64_t t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= S) return -3;
    if (T * H * D < (1 << 16) || nthreads < 1) nthreads = 1;
    float *tmp = f16 ? malloc(sizeof(float) * (size_t)(D * nthreads)) : NULL;  // a row a thread
    if (f16 && tmp == NULL) return -2;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * half, *s = sin + t * half, *kvt = kv + t * ldkv;
        float *qat = qa + t * H * D;
        for (int64_t h = 0; h < H; h++) {
            memcpy(qat + h * D, kb + t * kb_t + h * kb_h, sizeof(float) * (size_t)rank);
            mla_rope(q + t * ldq + h * qd + qd - R, perm, R, c, s, qat + h * D + rank);
        }
#if defined(_OPENMP)
        const int64_t me = omp_get_thread_num();
#else
        const int64_t me = 0;
#endif
        float *row = f16 ? tmp + me * D : (float *)cache + slots[t] * ldc;
        ls_rms_norm(kvt, 1, 1, rank, rank, w, 1, eps, row, 1);
        mla_rope(kvt + rank, perm, R, c, s, row + rank);
        if (f16) {
            uint16_t *dst = (uint16_t *)cache + slots[t] * ldc;
            for (int64_t i = 0; i < D; i++) dst[i] = f32_to_f16(row[i]);
        }
    }
    free(tmp);
    return 0;
}
