// A decode step of a Mamba-2 mixer in one call (issue 28: the mixer's ~15 torch ops and
// kernel calls between its two projections cost ~0.2 ms a layer): T rows, each the one new
// row of its own sequence, from the in-projection's output to the out-projection's input.
//
// Same bits as recurrent/mamba2.py's forward, which runs these very pieces one call at a time:
// ls_conv_step (conv, bias, SiLU), the scan of ls_ssm_scan2 (torch_sum's order), y + x D as
// torch's multiply then add, ls_gated_act (SiLU(z) y) and ls_rms_norm (the grouped norm). The
// scan reads each head's old state and writes its new one into the sequence's new record
// (never a copy, then an update in place: half the state traffic of scan2's decode step).
// Included in the build unit after ssm_scan.c (torch_sum, SSM_MAX_N); the rest link.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

int ls_conv_step(const float *st, const float *x, const float *taps, const float *bias,
                 int64_t C, int64_t L, const float *ones, float *pre, float *act,
                 float *conv_out);
int ls_gated_act(const float *g, const float *u, int64_t T, int64_t F, int64_t ld, int act,
                 float *out, int nthreads);
int ls_rms_norm(const float *x, int64_t T, int64_t H, int64_t K, int64_t ldt, const float *w,
                int64_t HW, float eps, float *y, int nthreads);

#if defined(__AVX2__)
// One head's P rows with torch's 8-lane sums of N values (N a multiple of 8, under 512: the
// short form of torch_sum, no tail), the products summed as they are made (no store and
// reload): per element index e of 8 lanes, accumulator e % 4 (the last N/8 % 4 into 0), then
// 0 += 1, += 2, += 3, the 8 lanes in order: small_sum_8's and torch_sum's adds, in their order.
// The new state is written with non-temporal stores (no read of the record's lines first:
// a decode step's states stream through memory between steps anyway). Thread CPU a layer of
// Granite-4 shape (1.5 MB of state), 1 thread, vs the generic loop: 134-138 vs 140-153 us
// with 40 MB read between layers, 79-83 vs 82-92 us with the state in cache (noisy machine).
static void head_rows8(const float *restrict si, float *restrict so, const float *x,
                       const float *b, const float *c, float dq, float a, float dh, int64_t P,
                       int64_t N, float *yd) {
    const int64_t nv = N / 8, full = nv / 4 * 4;
    const __m256 va = _mm256_set1_ps(a);
    const int nt = ((uintptr_t)so & 31) == 0;  // aligned: stored past the caches
    for (int64_t p = 0; p < P; p++) {
        const __m256 vxd = _mm256_set1_ps(x[p] * dq);
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps()};
        const float *sp = si + p * N;
        float *op = so + p * N;
        for (int64_t e = 0; e < nv; e++) {
            const __m256 s = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(sp + 8 * e), va),
                                           _mm256_mul_ps(_mm256_loadu_ps(b + 8 * e), vxd));
            if (nt) _mm256_stream_ps(op + 8 * e, s);
            else _mm256_storeu_ps(op + 8 * e, s);
            const __m256 pr = _mm256_mul_ps(s, _mm256_loadu_ps(c + 8 * e));
            const int k = e < full ? (int)(e & 3) : 0;
            acc[k] = _mm256_add_ps(acc[k], pr);
        }
        acc[0] = _mm256_add_ps(acc[0], acc[1]);
        acc[0] = _mm256_add_ps(acc[0], acc[2]);
        acc[0] = _mm256_add_ps(acc[0], acc[3]);
        float lanes[8], fin = 0.0f;
        _mm256_storeu_ps(lanes, acc[0]);
        for (int l = 0; l < 8; l++) fin += lanes[l];
        const float xD = x[p] * dh;
        yd[p] = (0.0f + fin) + xD;
    }
    _mm_sfence();  // the streamed state is visible before the record is read again
}
#endif

// zx [T, ldz]: each row z [H P], xBC [H P + 2 G N], (dt, unread); dt, da [T, H] (softplus(dt +
// dt_bias) and exp(dt A), from torch); st_in[q] / st_out[q]: row q's sequence's state record
// before / after the row, [(L-1) C | H P N] (C = H P + 2 G N conv channels; never the same
// memory); taps [L, C], conv_b [C] (NULL: none), ones [C] of 1.0f; d [H]; norm [G, H P / G]
// (NULL: none) with eps; out [T, H P]: the out-projection's input. vl: torch's sum width (the
// wrapper's probe). Returns 0, -2 out of memory, -3 sizes that do not fit.
int ls_mamba2_step(const float *zx, int64_t ldz, const float *dt, const float *da, int64_t T,
                   const float *const *st_in, float *const *st_out, const float *taps,
                   const float *conv_b, const float *ones, const float *d, const float *norm,
                   float eps, int64_t H, int64_t P, int64_t N, int64_t G, int64_t L, float *out,
                   int vl, int nthreads) {
    const int64_t di = H * P, C = di + 2 * G * N, nc = (L - 1) * C, PN = P * N;
    if (T < 1 || H < 1 || P < 1 || N < 1 || N > SSM_MAX_N || G < 1 || H % G || di % G ||
        L < 2 || ldz < di + C || vl < 1 || vl > 16 || !zx || !dt || !da || !st_in || !st_out ||
        !taps || !ones || !d || !out)
        return -3;
    for (int64_t q = 0; q < T; q++)
        if (!st_in[q] || !st_out[q]) return -3;
    // xbc [T, C] after conv and SiLU, pre [C] (the conv before SiLU), yd [T, di], g [T, di]
    float *buf = malloc(sizeof(float) * (size_t)(T * C + C + 2 * T * di));
    if (!buf) return -2;
    float *xbc = buf, *pre = xbc + T * C, *yd = pre + C, *g = yd + T * di;
    for (int64_t q = 0; q < T; q++)
        if (ls_conv_step(st_in[q], zx + q * ldz + di, taps, conv_b, C, L, ones, pre,
                         xbc + q * C, st_out[q])) {
            free(buf);
            return -3;
        }
    const int64_t rep = H / G;
    if (T * H * PN < 4096) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int64_t qh = 0; qh < T * H; qh++) {
        const int64_t q = qh / H, h = qh % H;
        const float *restrict si = st_in[q] + nc + h * PN;
        float *restrict so = st_out[q] + nc + h * PN;
        const float *x = xbc + q * C + h * P, *b = xbc + q * C + di + (h / rep) * N;
        const float *c = b + G * N;
        const float dq = dt[q * H + h], a = da[q * H + h], dh = d[h];
#if defined(__AVX2__)
        if (vl == 8 && N % 8 == 0 && N < 512) {
            head_rows8(si, so, x, b, c, dq, a, dh, P, N, yd + q * di + h * P);
            continue;
        }
#endif
        float prod[SSM_MAX_N];
        for (int64_t p = 0; p < P; p++) {
            const float xd = x[p] * dq;
            for (int64_t n = 0; n < N; n++) {
                const float decay = si[p * N + n] * a, inp = b[n] * xd;
                so[p * N + n] = decay + inp;
                prod[n] = so[p * N + n] * c[n];
            }
            const float xD = x[p] * dh;
            yd[q * di + h * P + p] = torch_sum(prod, N, vl) + xD;
        }
    }
    int rc = 0;
    for (int64_t q = 0; q < T && !rc; q++)
        rc = ls_gated_act(zx + q * ldz, yd + q * di, 1, di, di, 0, norm ? g + q * di : out + q * di,
                          1);
    if (!rc && norm) rc = ls_rms_norm(g, T, G, di / G, di, norm, G, eps, out, 1);
    free(buf);
    return rc ? -3 : 0;
}

// dt [T, H] = softplus(raw + bias) and da [T, H] = exp(dt a), each value alone with libm's
// expf and log1pf (llama.cpp's ggml_ssm_scan formula: x > 20 ? x : log1pf(expf(x))), so a
// value's bits never depend on the row count or the layout (torch's vector/scalar split
// does). raw: row t at raw + t * ld. Every Mamba-2 path calls this (prefill, decode, the
// fused layers), so they agree bit for bit. Returns 0, -3 sizes that do not fit.
int ls_ssm_dt(const float *raw, int64_t ld, int64_t T, int64_t H, const float *bias,
              const float *a, float *dt, float *da) {
    if (T < 0 || H < 1 || ld < H || !raw || !bias || !a || !dt || !da) return -3;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const float x = raw[t * ld + h] + bias[h];
            const float s = x > 20.0f ? x : log1pf(expf(x));
            dt[t * H + h] = s;
            da[t * H + h] = expf(s * a[h]);
        }
    return 0;
}
