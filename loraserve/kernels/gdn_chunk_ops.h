// The register blocks of gdn_chunk.c: a chunk's M0 k and M0 q (gc_mk; gc_mk_tiles on the
// row-major state), its rows' dot products with the chunk's keys (gc_dots) and the chunk end's
// state update (gc_end; gc_end_rows row-major). Every lane (a value index a, a key index b or a
// pending row j) runs its own sequence of float operations, the same in each form and at any
// vector width; included by gdn_chunk.c (deltanet.c's unit: tr8).
#pragma once
#include <stdint.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

// Value lanes of one register block, gc_mk's and gc_end's (the fastest measured at S = 128):
// the counts set only which lanes share a loop, never a value's operations.
#if defined(__AVX512F__)
enum { GC_LANES = 16, GC_END_LANES = 128 };
#else
enum { GC_LANES = 16, GC_END_LANES = 32 };
#endif
enum { GC_DOTS = 16, GC_MAX_C = 256 };  // pending-row lanes of gc_dot2; chunk sizes
// Sequences of fewer rows in a call (decode steps, drafts) run on the row-major state, never
// transposed (with AVX2 and S % 16 == 0): the same operations per value, so the same bits.
enum { GC_BLOCK_MIN = 4, GC_ROWB = 64 };

// w[i][a0 + l] = sum_b mt[b][a0 + l] k_i[b] and x[i][a0 + l] the same of q_i, l < nr (the
// key and query rows kp[i], qp[i], i < ng), two rows at a time: four independent chains per
// lane block. Inlined with nr a constant where it is one (the lanes in registers).
static inline __attribute__((always_inline)) void gc_mk(const float *restrict mt,
                                                        const float *const *kp,
                                                        const float *const *qp, int64_t ng,
                                                        int64_t a0, int64_t nr, int64_t S,
                                                        float *restrict w, float *restrict x) {
    for (int64_t i = 0; i < ng; i += 2) {
        const int64_t i1 = i + 1 < ng ? i + 1 : i;  // an odd last row runs twice
        float aw[GC_LANES], ax[GC_LANES], bw[GC_LANES], bx[GC_LANES];
        for (int64_t l = 0; l < nr; l++) aw[l] = ax[l] = bw[l] = bx[l] = 0.0f;
        const float *ki = kp[i], *qi = qp[i], *kj = kp[i1], *qj = qp[i1];
        for (int64_t b = 0; b < S; b++) {
            const float *m = mt + b * S + a0;
            const float k0 = ki[b], q0 = qi[b], k1 = kj[b], q1 = qj[b];
            for (int64_t l = 0; l < nr; l++) {
                aw[l] = aw[l] + m[l] * k0;
                ax[l] = ax[l] + m[l] * q0;
                bw[l] = bw[l] + m[l] * k1;
                bx[l] = bx[l] + m[l] * q1;
            }
        }
        for (int64_t l = 0; l < nr; l++) {
            w[i * S + a0 + l] = aw[l], x[i * S + a0 + l] = ax[l];
            w[i1 * S + a0 + l] = bw[l], x[i1 * S + a0 + l] = bx[l];
        }
    }
}

// The chunk's end: mt[b][a0 + l] = eg mt[b][a0 + l] + sum_j cu[j][a0 + l] kr[j][b], l < nr,
// two key indices b at a time.
static inline __attribute__((always_inline)) void gc_end(float *restrict mt, const float *cu,
                                                         const float *kr, float eg, int64_t a0,
                                                         int64_t nr, int64_t S, int64_t C) {
    for (int64_t b = 0; b < S; b += 2) {
        const int64_t b1 = b + 1 < S ? b + 1 : b;  // an odd last index runs twice
        float acc[GC_END_LANES], acd[GC_END_LANES];
        float *m = mt + b * S + a0, *m1 = mt + b1 * S + a0;
        for (int64_t l = 0; l < nr; l++) acc[l] = m[l] * eg, acd[l] = m1[l] * eg;
        for (int64_t j = 0; j < C; j++) {
            const float *c = cu + j * S + a0;
            const float k0 = kr[j * S + b], k1 = kr[j * S + b1];
            for (int64_t l = 0; l < nr; l++) {
                acc[l] = acc[l] + c[l] * k0;
                acd[l] = acd[l] + c[l] * k1;
            }
        }
        for (int64_t l = 0; l < nr; l++) m[l] = acc[l], m1[l] = acd[l];
    }
}

// kk[i][j] = k_i . k_j and qk[i][j] = q_i . k_j (each over b from 0), lanes j0 .. j0 + nr - 1
// of kt [S][C], for rows i .. i + 1 of kp, qp (i1: the second, == i for an odd last row).
static inline __attribute__((always_inline)) void gc_dot2(const float *kt, const float *const *kp,
                                                          const float *const *qp, int64_t i,
                                                          int64_t i1, int64_t j0, int64_t nr,
                                                          float *restrict kk, float *restrict qk,
                                                          int64_t S, int64_t C) {
    float k0[GC_DOTS], q0[GC_DOTS], k1[GC_DOTS], q1[GC_DOTS];
    for (int64_t l = 0; l < nr; l++) k0[l] = q0[l] = k1[l] = q1[l] = 0.0f;
    const float *ka = kp[i], *qa = qp[i], *kb = kp[i1], *qb = qp[i1];
    for (int64_t b = 0; b < S; b++) {
        const float *c = kt + b * C + j0;
        const float x0 = ka[b], y0 = qa[b], x1 = kb[b], y1 = qb[b];
        for (int64_t l = 0; l < nr; l++) {
            k0[l] = k0[l] + x0 * c[l];
            q0[l] = q0[l] + y0 * c[l];
            k1[l] = k1[l] + x1 * c[l];
            q1[l] = q1[l] + y1 * c[l];
        }
    }
    for (int64_t l = 0; l < nr; l++) {
        kk[i * C + j0 + l] = k0[l], qk[i * C + j0 + l] = q0[l];
        kk[i1 * C + j0 + l] = k1[l], qk[i1 * C + j0 + l] = q1[l];
    }
}

// kk[i][j] = k_i . k_j and qk[i][j] = q_i . k_j for the ng rows kp, qp and every lane j < C of
// kt [S][C]: the rows' dot products with the chunk's keys.
static void gc_dots(const float *kt, const float *const *kp, const float *const *qp, int64_t ng,
                    float *restrict kk, float *restrict qk, int64_t S, int64_t C) {
    for (int64_t i = 0; i < ng; i += 2) {
        const int64_t i1 = i + 1 < ng ? i + 1 : i;
        int64_t j0 = 0;
        for (; j0 + GC_DOTS <= C; j0 += GC_DOTS)
            gc_dot2(kt, kp, qp, i, i1, j0, GC_DOTS, kk, qk, S, C);
        if (j0 < C) gc_dot2(kt, kp, qp, i, i1, j0, C - j0, kk, qk, S, C);
    }
}

#if defined(__AVX2__)
// gc_mk's w and x from the row-major m (S % 16 == 0) for ng < GC_BLOCK_MIN rows: 8x8 tiles
// transposed in registers (deltanet.c's tr8), lanes = 8 value indices a, each summing over b
// from 0 in order; m copied to copy on the way (NULL: not).
static void gc_mk_tiles(const float *m, const float *const *kp, const float *const *qp,
                        int64_t ng, int64_t S, float *w, float *x, float *copy) {
    for (int64_t a0 = 0; a0 < S; a0 += 16) {
        __m256 aw[2 * GC_BLOCK_MIN], ax[2 * GC_BLOCK_MIN];
        for (int64_t i = 0; i < 2 * ng; i++) aw[i] = ax[i] = _mm256_setzero_ps();
        for (int64_t b0 = 0; b0 < S; b0 += 8) {
            __m256 r[2][8];
            for (int y = 0; y < 2; y++) {
                const int64_t at = (a0 + 8 * y) * S + b0;
                for (int l = 0; l < 8; l++) r[y][l] = _mm256_loadu_ps(m + at + l * S);
                if (copy != NULL)
                    for (int l = 0; l < 8; l++) _mm256_storeu_ps(copy + at + l * S, r[y][l]);
                tr8(r[y]);
            }
            for (int64_t i = 0; i < ng; i++)
                for (int c = 0; c < 8; c++) {
                    const __m256 kb = _mm256_set1_ps(kp[i][b0 + c]);
                    const __m256 qb = _mm256_set1_ps(qp[i][b0 + c]);
                    for (int y = 0; y < 2; y++) {
                        aw[2 * i + y] = _mm256_add_ps(aw[2 * i + y], _mm256_mul_ps(r[y][c], kb));
                        ax[2 * i + y] = _mm256_add_ps(ax[2 * i + y], _mm256_mul_ps(r[y][c], qb));
                    }
                }
        }
        for (int64_t i = 0; i < ng; i++)
            for (int y = 0; y < 2; y++) {
                _mm256_storeu_ps(w + i * S + a0 + 8 * y, aw[2 * i + y]);
                _mm256_storeu_ps(x + i * S + a0 + 8 * y, ax[2 * i + y]);
            }
    }
}
#define GC_TILES 1
#else
#define GC_TILES 0
#endif

// gc_end's operations on row-major states: dst[a][b] = eg src[a][b] + sum_j cu[j][a] kr[j][b]
// (src may be dst), lanes b.
static void gc_end_rows(const float *src, float *dst, const float *cu, const float *kr,
                        float eg, int64_t S, int64_t C) {
    for (int64_t a = 0; a < S; a++)
        for (int64_t b0 = 0; b0 < S; b0 += GC_ROWB) {
            const int64_t nb = S - b0 < GC_ROWB ? S - b0 : GC_ROWB;
            float acc[GC_ROWB];
            for (int64_t l = 0; l < nb; l++) acc[l] = src[a * S + b0 + l] * eg;
            for (int64_t j = 0; j < C; j++) {
                const float c = cu[j * S + a], *k = kr + j * S + b0;
                for (int64_t l = 0; l < nb; l++) acc[l] = acc[l] + c * k[l];
            }
            for (int64_t l = 0; l < nb; l++) dst[a * S + b0 + l] = acc[l];
        }
}
