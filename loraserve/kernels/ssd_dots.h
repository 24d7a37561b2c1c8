// Fixed-order float dot products of the chunked Mamba-2 scan (ssd_chunk.c) in GCC/clang
// vectors: every operation lane by lane, so AVX2, AVX-512 and SSE builds give the same bits.
#pragma once
#include <stdint.h>
#include <string.h>

enum { SSD_LANES = 16 };

// GCC/clang vectors, every operation lane by lane, so no bit depends on which width runs:
// ssd_w is the machine's (16 lanes on AVX-512, 8 on AVX2), ssd_v8 the fold's 8.
typedef float ssd_v8 __attribute__((vector_size(32)));
#ifdef __AVX512F__
typedef float ssd_w __attribute__((vector_size(64)));
enum { SSD_W = 16 };
#else
typedef ssd_v8 ssd_w;
enum { SSD_W = 8 };
#endif
enum { SSD_U = SSD_LANES / SSD_W };  // ssd_w vectors per 16 lanes

static inline ssd_w ssd_ld(const float *p) {
    ssd_w v;
    memcpy(&v, p, sizeof(v));
    return v;
}

// lane l of 16 lanes (u[0], u[1], ..) plus lane l + 8, l < 8: a dot's first fold step
static inline ssd_v8 ssd_half(const ssd_w *u) {
#ifdef __AVX512F__
    return __builtin_shufflevector(u[0], u[0], 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(u[0], u[0], 8, 9, 10, 11, 12, 13, 14, 15);
#else
    return u[0] + u[1];
#endif
}

// Lane k of the result: f[k]'s 8 lanes folded by halves (l + 4, then l + 2, l + 1), for 8
// vectors at once by shuffles.
static inline ssd_v8 ssd_fold8(const ssd_v8 f[8]) {
    ssd_v8 g[4], h[2];
    for (int m = 0; m < 4; m++)
        g[m] = __builtin_shufflevector(f[2 * m], f[2 * m + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(f[2 * m], f[2 * m + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int m = 0; m < 2; m++)
        h[m] = __builtin_shufflevector(g[2 * m], g[2 * m + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               __builtin_shufflevector(g[2 * m], g[2 * m + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    return __builtin_shufflevector(h[0], h[1], 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(h[0], h[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

// The dot products of R vectors a[r] [n] with k <= 16 rows m + l ld [n]:
// out[r * 16 + l] = dot(a[r], m + l ld), where dot(u, v) puts u[i] v[i] into lane i % 16 in
// ascending i (each lane from 0.0f), then folds the 16 lanes by halves (lane l += lane l + 8
// for l < 8, then l + 4, l + 2, l + 1). Every dot is the same operations whatever R, k and
// its neighbours; inlined with R a constant.
static inline __attribute__((always_inline)) void ssd_dots(const float *const *a, int R,
                                                            const float *m, int64_t ld,
                                                            int64_t k, int64_t n, float *out) {
    ssd_v8 f[4][16];
    const int64_t nv = n / SSD_LANES * SSD_LANES;
    for (int64_t l = 0; l < 16; l++) {
        ssd_w s[4][SSD_U];
        memset(s, 0, sizeof(s));
        if (l < k) {
            const float *ml = m + l * ld;
            for (int64_t i = 0; i < nv; i += SSD_LANES)
                for (int u = 0; u < SSD_U; u++) {
                    const ssd_w mv = ssd_ld(ml + i + u * SSD_W);
                    for (int r = 0; r < R; r++) s[r][u] += mv * ssd_ld(a[r] + i + u * SSD_W);
                }
            for (int64_t i = nv; i < n; i++)
                for (int r = 0; r < R; r++)
                    s[r][(i - nv) / SSD_W][(i - nv) % SSD_W] += ml[i] * a[r][i];
        }
        for (int r = 0; r < R; r++) f[r][l] = ssd_half(s[r]);
    }
    for (int r = 0; r < R; r++) {
        const ssd_v8 lo = ssd_fold8(f[r]), hi = ssd_fold8(f[r] + 8);
        memcpy(out + r * 16, &lo, sizeof(lo));
        memcpy(out + r * 16 + 8, &hi, sizeof(hi));
    }
}
