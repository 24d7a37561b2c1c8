// Attention over an f16 KV pool with llama.cpp's numerics (included by attention.c).
//
// llama-server keeps K and V in fp16 by default (--cache-type-k/-v f16) and runs ggml-cpu's
// flash attention, whose per-row path (every decode step, and prompts under 64 rows) does,
// for each query vector: q rounded to fp16; then for each key in position order, the score
// s = (q . k) * scale (soft-capped: cap * tanh(s / cap)), an online softmax whose value
// accumulator is itself fp16: a new maximum M rescales it by expf(M_old - M) (rounded to
// fp16), otherwise the key's weight is expf(s - M); acc = fp16(acc + w * v); the weights'
// sum S = S * ms + w in float32; a sink logit joins (M, S) after the keys; out = acc / S.
// Emulating this (issue 27) brought the median log-probability difference from llama-server
// on the recorded tiny models from 0.0016 to 0.0001 in F32, and with ggml's activation
// rounding (quantize.c) from 0.036 to 0.004 in Q8_0 (the rounding alone did not move it).
//
// Row independence holds by construction: a query vector's result is one fixed sequence of
// operations over its own keys in position order; threads split the vectors only.

#include "f16.h"

// q . k over D values, q floats (fp16 values), k fp16 bits: two 8-lane accumulators over
// alternate chunks as dot1, then the tail in order
static inline float dot_f16(const float *q, const uint16_t *k, int64_t D) {
    int64_t d = 0;
    float r = 0.0f;
#if defined(__AVX2__) && defined(__F16C__)
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (; d + 16 <= D; d += 16) {
        a = madd8(_mm256_loadu_ps(q + d), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d))), a);
        b = madd8(_mm256_loadu_ps(q + d + 8),
                  _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d + 8))), b);
    }
    if (d + 8 <= D) {
        a = madd8(_mm256_loadu_ps(q + d), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d))), a);
        d += 8;
    }
    r = hsum8(_mm256_add_ps(a, b));
#endif
    for (; d < D; d++) r = madd1(q[d], f16_to_f32(k[d]), r);
    return r;
}

// acc = fp16(acc * ms) (ms != 1) then acc = fp16(fma(v, w, acc)), elementwise
static inline void mad_f16(float *acc, const uint16_t *v, float ms, float w, int64_t Dv) {
    int64_t d = 0;
#if defined(__AVX2__) && defined(__F16C__)
    const int rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256 vms = _mm256_set1_ps(ms), vw = _mm256_set1_ps(w);
    for (; d + 8 <= Dv; d += 8) {
        __m256 a = _mm256_loadu_ps(acc + d);
        if (ms != 1.0f) a = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(a, vms), rn));
        a = madd8(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + d))), vw, a);
        _mm256_storeu_ps(acc + d, _mm256_cvtph_ps(_mm256_cvtps_ph(a, rn)));
    }
#endif
    for (; d < Dv; d++) {
        float a = acc[d];
        if (ms != 1.0f) a = round_f16(a * ms);
        acc[d] = round_f16(madd1(f16_to_f32(v[d]), w, a));
    }
}

// One query vector: q [D] floats, its keys' K/V rows (fp16) at kc + krow[j], vc + vrow[j]
// for j in lo..hi-1 (position order); qh, acc: scratch of D and Dv floats; out [Dv].
static void attend_f16(const float *q, const uint16_t *kc, const uint16_t *vc,
                       const int64_t *krow, const int64_t *vrow, int64_t lo, int64_t hi,
                       float scale, float softcap, const float *sink, float *qh, float *acc,
                       float *out, int64_t D, int64_t Dv) {
    for (int64_t d = 0; d < D; d++) qh[d] = round_f16(q[d]);
    for (int64_t d = 0; d < Dv; d++) acc[d] = 0.0f;
    const float sc = softcap > 0.0f ? scale / softcap : scale;
    float M = -INFINITY, S = 0.0f;
    for (int64_t j = lo; j < hi; j++) {
        float s = dot_f16(qh, kc + krow[j], D) * sc;
        if (softcap > 0.0f) s = softcap * tanhf(s);
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            const float Mold = M;
            M = s;
            ms = expf(Mold - M);
        } else {
            vs = expf(s - M);
        }
        mad_f16(acc, vc + vrow[j], ms, vs, Dv);
        S = S * ms + vs;
    }
    if (sink != NULL) {
        float ms = 1.0f, vs = 1.0f;
        if (*sink > M) {
            ms = expf(M - *sink);
            M = *sink;
            for (int64_t d = 0; d < Dv; d++) acc[d] *= ms;
        } else {
            vs = expf(*sink - M);
        }
        S = S * ms + vs;
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int64_t d = 0; d < Dv; d++) out[d] = acc[d] * inv;
}

// ls_attention_ex (attention.c) over an fp16 pool: the same arguments, k_cache and v_cache
// fp16 bits (strides ldk, ldv in values); returns 0, -1 (inconsistent metadata), -2 (memory).
int ls_attention_f16(const float *q, int64_t ldq, const uint16_t *k_cache, int64_t ldk,
                     const uint16_t *v_cache, int64_t ldv, int64_t S, const int64_t *slots,
                     const int64_t *seq_off, int64_t B, const int32_t *row_seq,
                     const int32_t *row_nkeys, int32_t window, float scale, float softcap,
                     const float *sinks, float *out, int64_t T, int64_t H, int64_t Hkv,
                     int64_t D, int64_t Dv, int nthreads) {
    if (H <= 0 || Hkv <= 0 || H % Hkv != 0 || D <= 0 || Dv <= 0 || T < 0 || B < 0 ||
        seq_off[0] < 0 || ldq < H * D || ldk < Hkv * D || ldv < Hkv * Dv)
        return -1;  // the row strides as ls_attention_ex checks them (issue 31)
    int64_t max_seq = 1;
    for (int64_t b = 0; b < B; b++) {
        if (seq_off[b + 1] < seq_off[b]) return -1;
        max_seq = seq_off[b + 1] - seq_off[b] > max_seq ? seq_off[b + 1] - seq_off[b] : max_seq;
    }
    for (int64_t i = seq_off[0]; i < seq_off[B]; i++)
        if (slots[i] < 0 || slots[i] >= S) return -1;
    for (int64_t t = 0; t < T; t++) {
        int32_t b = row_seq[t], n = row_nkeys[t];
        if (b < 0 || b >= B || n < 1 || n > seq_off[b + 1] - seq_off[b]) return -1;
    }
    if (T == 0) return 0;
    if (nthreads < 1) nthreads = 1;
    if (T * H < 4) nthreads = 1;
    int64_t *ibuf = malloc(sizeof(int64_t) * (size_t)(2 * max_seq * nthreads));
    float *fbuf = malloc(sizeof(float) * (size_t)((D + Dv) * nthreads));
    if (ibuf == NULL || fbuf == NULL) {
        free(ibuf);
        free(fbuf);
        return -2;
    }
    const int64_t group = H / Hkv;
#pragma omp parallel num_threads(nthreads)
    {
#if defined(_OPENMP)
        const int64_t me = omp_get_thread_num();
#else
        const int64_t me = 0;
#endif
        int64_t *krow = ibuf + 2 * me * max_seq, *vrow = krow + max_seq;
        float *qh = fbuf + me * (D + Dv), *acc = qh + D;
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < T * H; w++) {
            const int64_t t = w / H, h = w % H, kh = h / group;
            const int64_t n = row_nkeys[t], lo = window > 0 && n > window ? n - window : 0;
            const int64_t *sl = slots + seq_off[row_seq[t]];
            for (int64_t j = lo; j < n; j++) {
                krow[j] = sl[j] * ldk + kh * D;
                vrow[j] = sl[j] * ldv + kh * Dv;
            }
            attend_f16(q + t * ldq + h * D, k_cache, v_cache, krow, vrow, lo, n, scale,
                       softcap, sinks != NULL ? sinks + h : NULL, qh, acc,
                       out + (t * H + h) * Dv, D, Dv);
        }
    }
    free(ibuf);
    free(fbuf);
    return 0;
}
