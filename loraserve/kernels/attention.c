// Softmax attention over the paged KV pool, with a fixed reduction order per query row.
//
// Row independence, by construction: the output of query row t, head h (a "query vector")
// is computed from q[t, h], the keys/values of the positions it attends (read from the pool
// by its sequence's slot list, in position order) and nothing else, by one fixed sequence of
// float operations that depends only on D and on the row's own key count: each score by the
// same fixed-order dot product, their max, exp(s_j - max) and their sum in key order, then
// sum_j p_j v_j in key order divided by that sum. Threads split the query vectors, never a
// sum over keys. So a row gives the same bits alone or in any batch, in a prefill chunk of
// any size or as a one-token decode step, and whether its keys came from the prefix cache.
//
// Speed without changing a bit: one work item holds the query vectors that read the same
// keys (the heads sharing a KV head, and up to a few consecutive rows of one sequence), so
// each key and value is loaded once per item rather than once per vector; which vectors
// share an item changes only the loads, never any vector's operations.
//
// Options (ls_attention_ex): logit soft-capping (gemma2: s = cap * tanh(s / cap) after the
// scale), attention sinks (gpt-oss: one learned logit per query head that joins the softmax's
// max and denominator but adds no value), and values of another width than the keys, read
// at their own stride (latent attention: V is the first Dv floats of each compressed K row).
// Each is one more fixed, per-vector operation, so the row independence above holds as is.
//
// Non-finite inputs give non-finite outputs: a NaN or infinite score makes exp(s - max) NaN
// (inf - inf) or is carried as NaN, and a NaN or infinite value carries into the weighted sum.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "simd.h"

enum { QV = 16 };  // query vectors per work item, at most


// One score's dot product. AVX2: two 8-lane accumulators over alternate 8-value chunks, an
// odd chunk into the first, their sum, a fixed horizontal sum, then the D % 8 tail in order.
// dot4 computes exactly this for 4 query vectors against one key (loading the key once).
static inline float dot1(const float *q, const float *k, int64_t D) {
    int64_t d = 0;
    float r = 0.0f;
#if defined(__AVX2__)
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (; d + 16 <= D; d += 16) {
        a = madd8(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a);
        b = madd8(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), b);
    }
    if (d + 8 <= D) {
        a = madd8(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a);
        d += 8;
    }
    r = hsum8(_mm256_add_ps(a, b));
#endif
    for (; d < D; d++) r += q[d] * k[d];
    return r;
}

#if defined(__AVX2__)
static inline void dot4(const float *const q[4], const float *k, int64_t D, float r[4]) {
    __m256 a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        __m256 k0 = _mm256_loadu_ps(k + d), k1 = _mm256_loadu_ps(k + d + 8);
        for (int i = 0; i < 4; i++) {
            a[i] = madd8(_mm256_loadu_ps(q[i] + d), k0, a[i]);
            b[i] = madd8(_mm256_loadu_ps(q[i] + d + 8), k1, b[i]);
        }
    }
    int64_t d8 = d;
    if (d + 8 <= D) {
        __m256 k0 = _mm256_loadu_ps(k + d);
        for (int i = 0; i < 4; i++) a[i] = madd8(_mm256_loadu_ps(q[i] + d), k0, a[i]);
        d8 = d + 8;
    }
    for (int i = 0; i < 4; i++) {
        float s = hsum8(_mm256_add_ps(a[i], b[i]));
        for (int64_t e = d8; e < D; e++) s += q[i][e] * k[e];
        r[i] = s;
    }
}
#endif

// The query vectors of one work item: vector i attends keys lo[i] .. hi[i]-1, its scores and
// then weights p live at s[i] (index j - lo[i]), its output at out[i].
typedef struct {
    int64_t n, ulo, uhi;  // vectors; the union of their key ranges
    const float *q[QV];
    float *out[QV], *s[QV], sum[QV], sink[QV];  // sink: the head's sink logit (if sinks)
    int64_t lo[QV], hi[QV];
} item_t;

// The per-call options of ls_attention_ex (see there).
typedef struct {
    float softcap;        // > 0: s = softcap * tanh(s / softcap) after the scale
    const float *sinks;   // [H] per query head, or NULL
    int64_t Dv, ldk, ldv; // value width; floats from one slot's K (V) row to the next
} opts_t;

// exp of one value by the lanes' formula (AVX2), so a sink's term is computed as the scores'
static inline float exp1(float x) {
#if defined(__AVX2__)
    float b[8] = {x, 0, 0, 0, 0, 0, 0, 0};
    _mm256_storeu_ps(b, exp8(_mm256_loadu_ps(b)));
    return b[0];
#else
    return expf(x);
#endif
}

static inline int active(const item_t *it, int i, int64_t j) {
    return i < it->n && j >= it->lo[i] && j < it->hi[i];
}

// o[d] += p[x] * v[x][d] for x = 0 .. nk-1 in this order, every d (nk <= 4): one fma per key
// and value in AVX2 lanes, mul then add in the D % 8 tail, so a value's sequence of
// operations is the same whether its keys come in blocks of 4 or one at a time.
static inline void accumulate(float *o, const float *p, const float *const v[4], int nk,
                              int64_t D) {
    int64_t d = 0;
#if defined(__AVX2__)
    if (nk == 4) {
        __m256 p0 = _mm256_set1_ps(p[0]), p1 = _mm256_set1_ps(p[1]);
        __m256 p2 = _mm256_set1_ps(p[2]), p3 = _mm256_set1_ps(p[3]);
        for (; d + 8 <= D; d += 8) {
            __m256 a = _mm256_loadu_ps(o + d);
            a = madd8(p0, _mm256_loadu_ps(v[0] + d), a);
            a = madd8(p1, _mm256_loadu_ps(v[1] + d), a);
            a = madd8(p2, _mm256_loadu_ps(v[2] + d), a);
            a = madd8(p3, _mm256_loadu_ps(v[3] + d), a);
            _mm256_storeu_ps(o + d, a);
        }
    } else {
        for (; d + 8 <= D; d += 8) {
            __m256 a = _mm256_loadu_ps(o + d);
            for (int x = 0; x < nk; x++)
                a = madd8(_mm256_set1_ps(p[x]), _mm256_loadu_ps(v[x] + d), a);
            _mm256_storeu_ps(o + d, a);
        }
    }
#endif
    for (; d < D; d++)
        for (int x = 0; x < nk; x++) o[d] += p[x] * v[x][d];
}

// out_i = sum_j p_ij v_j / sum_i, accumulated in out_i itself: keys in blocks of 4 (their
// values stay in L1 while every vector attending them takes its share), each vector's keys
// in order lo..hi-1; a key a vector does not attend is skipped, not added as 0 * v.
// D: the values' width.
static void weighted_sum(const item_t *it, const float *vc, const int64_t *vrow, int64_t D) {
    for (int i = 0; i < it->n; i++)
        for (int64_t d = 0; d < D; d++) it->out[i][d] = 0.0f;
    for (int64_t j0 = it->ulo; j0 < it->uhi; j0 += 4) {
        const int nk = it->uhi - j0 < 4 ? (int)(it->uhi - j0) : 4;
        const float *v[4] = {vc, vc, vc, vc};
        for (int x = 0; x < nk; x++) v[x] = vc + vrow[j0 + x - it->ulo];
        for (int i = 0; i < it->n; i++) {
            const float *p = it->s[i] - it->lo[i];  // p[j]: vector i's weight of key j
            if (it->lo[i] <= j0 && j0 + nk <= it->hi[i]) {
                accumulate(it->out[i], p + j0, v, nk, D);
                continue;
            }
            for (int x = 0; x < nk; x++)
                if (active(it, i, j0 + x)) accumulate(it->out[i], p + j0 + x, v + x, 1, D);
        }
    }
    for (int i = 0; i < it->n; i++)
        for (int64_t d = 0; d < D; d++) it->out[i][d] /= it->sum[i];
}

// s[j] = cap * tanh(s[j] / cap) for j < m (AVX2: whole 8-lane vectors; the padding past m
// is zeros, never read as a score).
static void softcap(float *s, int64_t m, float cap) {
    const float inv = 1.0f / cap;
#if defined(__AVX2__)
    const __m256 vc = _mm256_set1_ps(cap), vi = _mm256_set1_ps(inv);
    for (int64_t j = 0; j < m; j += 8) {
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(s + j), vi);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(vc, tanh8(y)));
    }
#else
    for (int64_t j = 0; j < m; j++) s[j] = cap * tanh1(s[j] * inv);
#endif
}

static void attend(item_t *it, const float *kc, const float *vc, const int64_t *krow,
                   const int64_t *vrow, float scale, int64_t D, const opts_t *o) {
    // scores: each key once, against every vector that attends it (4 at a time)
    for (int64_t j = it->ulo; j < it->uhi; j++) {
        const float *k = kc + krow[j - it->ulo];
        int act[QV], na = 0;
        for (int i = 0; i < it->n; i++)
            if (active(it, i, j)) act[na++] = i;
        int a = 0;
#if defined(__AVX2__)
        for (; a + 4 <= na; a += 4) {
            const float *q4[4] = {it->q[act[a]], it->q[act[a + 1]], it->q[act[a + 2]],
                                  it->q[act[a + 3]]};
            float r[4];
            dot4(q4, k, D, r);
            for (int x = 0; x < 4; x++) it->s[act[a + x]][j - it->lo[act[a + x]]] = r[x];
        }
#endif
        for (; a < na; a++) it->s[act[a]][j - it->lo[act[a]]] = dot1(it->q[act[a]], k, D);
    }
    // softmax weights per vector, in key order
    for (int i = 0; i < it->n; i++) {
        float *s = it->s[i], mx = -INFINITY, sum = 0.0f;
        const int64_t m = it->hi[i] - it->lo[i];
        for (int64_t j = 0; j < m; j++) s[j] *= scale;
#if defined(__AVX2__)
        for (int64_t j = m; j < (m + 7) / 8 * 8; j++) s[j] = 0.0f;  // padding, never used
#endif
        if (o->softcap > 0.0f) softcap(s, m, o->softcap);
        for (int64_t j = 0; j < m; j++) mx = s[j] > mx ? s[j] : mx;
        const float sink = it->sink[i];
        if (o->sinks != NULL && sink > mx) mx = sink;
        if (isnan(mx) || mx == -INFINITY) mx = NAN;  // no finite score: NaN out
#if defined(__AVX2__)
        __m256 vmx = _mm256_set1_ps(mx);
        for (int64_t j = 0; j < m; j += 8)
            _mm256_storeu_ps(s + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx)));
        for (int64_t j = 0; j < m; j++) sum += s[j];
#else
        for (int64_t j = 0; j < m; j++) {
            s[j] = expf(s[j] - mx);
            sum += s[j];
        }
#endif
        if (o->sinks != NULL) sum += exp1(sink - mx);  // after the keys: the sink's share
        it->sum[i] = sum;
    }
    weighted_sum(it, vc, vrow, o->Dv);
}

// Attention of T query rows over their sequences' keys in the pool, with options.
//   q [T, H, D] (row stride ldq floats; heads contiguous), out [T, H, Dv] contiguous;
//   k_cache: slot s, KV head h's key at k_cache + s * ldk + h * D (D floats);
//   v_cache: its value at v_cache + s * ldv + h * Dv (Dv floats; may alias k_cache);
//   slots: every sequence's KV slot list (positions 0, 1, ... in order), concatenated;
//     sequence b's list is slots[seq_off[b] .. seq_off[b + 1]), seq_off [B + 1];
//   row_seq [T]: each row's sequence; row_nkeys [T]: keys it attends (positions 0..n-1,
//     so n = its position + 1); window > 0 keeps only keys with q_pos - k_pos < window;
//   softcap > 0: each scaled score s becomes softcap * tanh(s / softcap);
//   sinks [H] or NULL: query head h's sink logit joins the softmax (max and denominator).
// Query head h reads KV head h / (H / Hkv). Returns 0, or -1 (nothing written) when the
// metadata is inconsistent: a row's sequence or key count out of range, a slot outside the
// pool, or H not a multiple of Hkv; -2 when out of memory.
int ls_attention_ex(const float *q, int64_t ldq, const float *k_cache, int64_t ldk,
                    const float *v_cache, int64_t ldv, int64_t S, const int64_t *slots,
                    const int64_t *seq_off, int64_t B, const int32_t *row_seq,
                    const int32_t *row_nkeys, int32_t window, float scale, float softcap,
                    const float *sinks, float *out, int64_t T, int64_t H, int64_t Hkv,
                    int64_t D, int64_t Dv, int nthreads) {
    if (H <= 0 || Hkv <= 0 || H % Hkv != 0 || D <= 0 || Dv <= 0 || T < 0 || B < 0 ||
        seq_off[0] < 0)
        return -1;
    const opts_t o = {softcap, sinks, Dv, ldk, ldv};
    int64_t max_seq = 1, max_keys = 1;
    for (int64_t b = 0; b < B; b++) {
        if (seq_off[b + 1] < seq_off[b]) return -1;
        max_seq = seq_off[b + 1] - seq_off[b] > max_seq ? seq_off[b + 1] - seq_off[b] : max_seq;
    }
    for (int64_t i = seq_off[0]; i < seq_off[B]; i++)
        if (slots[i] < 0 || slots[i] >= S) return -1;
    for (int64_t t = 0; t < T; t++) {
        int32_t b = row_seq[t], n = row_nkeys[t];
        if (b < 0 || b >= B || n < 1 || n > seq_off[b + 1] - seq_off[b]) return -1;
        int64_t m = window > 0 && n > window ? window : n;
        max_keys = m > max_keys ? m : max_keys;
    }
    if (T == 0) return 0;
    if (nthreads < 1) nthreads = 1;
    // work items: blocks of up to `rows` consecutive rows of one sequence, times KV heads,
    // times slices of the heads sharing a KV head (split only to give every thread work)
    const int64_t group = H / Hkv, rows = group >= QV ? 1 : QV / group;
    int64_t *block = malloc(sizeof(int64_t) * (size_t)(T + 1));  // first row of each block
    if (block == NULL) return -2;
    int64_t nb = 0;
    for (int64_t t = 0; t < T; nb++) {
        block[nb] = t;
        int64_t t1 = t + 1;
        while (t1 < T && t1 - t < rows && row_seq[t1] == row_seq[t]) t1++;
        t = t1;
    }
    block[nb] = T;
    int64_t slice = group < QV ? group : QV;  // heads per item (rows * slice <= QV)
    while (slice > 1 && nb * Hkv * ((group + slice - 1) / slice) < nthreads)
        slice = (slice + 1) / 2;
    const int64_t nslices = (group + slice - 1) / slice, items = nb * Hkv * nslices;
    // per thread: QV score rows (padded to whole 8-lane vectors) and the keys' offsets
    const int64_t stride = max_keys + 8;
    float *s_all = malloc(sizeof(float) * (size_t)(stride * QV * nthreads));
    int64_t *vrow_all = malloc(sizeof(int64_t) * (size_t)(2 * max_seq * nthreads));
    if (s_all == NULL || vrow_all == NULL) {
        free(block);
        free(s_all);
        free(vrow_all);
        return -2;
    }
#pragma omp parallel num_threads(nthreads)
    {
#if defined(_OPENMP)
        const int64_t me = omp_get_thread_num();
#else
        const int64_t me = 0;
#endif
        int64_t *krow = vrow_all + 2 * me * max_seq, *vrow = krow + max_seq;
        item_t it;
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < items; w++) {
            const int64_t b = w / (Hkv * nslices), kh = w / nslices % Hkv;
            const int64_t h0 = kh * group + w % nslices * slice;
            const int64_t h1 = h0 + slice < (kh + 1) * group ? h0 + slice : (kh + 1) * group;
            const int64_t t0 = block[b], t1 = block[b + 1];  // (t1 - t0) * (h1 - h0) <= QV
            it.n = 0;
            it.ulo = INT64_MAX;
            it.uhi = 0;
            for (int64_t t = t0; t < t1; t++) {
                const int64_t n = row_nkeys[t], lo = window > 0 && n > window ? n - window : 0;
                for (int64_t h = h0; h < h1; h++) {
                    const int i = (int)it.n++;
                    it.q[i] = q + t * ldq + h * D;
                    it.out[i] = out + (t * H + h) * Dv;
                    it.sink[i] = sinks != NULL ? sinks[h] : 0.0f;
                    it.s[i] = s_all + (me * QV + i) * stride;
                    it.lo[i] = lo;
                    it.hi[i] = n;
                }
                it.ulo = lo < it.ulo ? lo : it.ulo;
                it.uhi = n > it.uhi ? n : it.uhi;
            }
            const int64_t *sl = slots + seq_off[row_seq[t0]];
            for (int64_t j = it.ulo; j < it.uhi; j++) {
                krow[j - it.ulo] = sl[j] * ldk + kh * D;
                vrow[j - it.ulo] = sl[j] * ldv + kh * Dv;
            }
            attend(&it, k_cache, v_cache, krow, vrow, scale, D, &o);
        }
    }
    free(block);
    free(s_all);
    free(vrow_all);
    return 0;
}

// ls_attention_ex without options: K and V pools [S, Hkv, D] contiguous (documented there).
int ls_attention(const float *q, int64_t ldq, const float *k_cache, const float *v_cache,
                 int64_t S, const int64_t *slots, const int64_t *seq_off, int64_t B,
                 const int32_t *row_seq, const int32_t *row_nkeys, int32_t window, float scale,
                 float *out, int64_t T, int64_t H, int64_t Hkv, int64_t D, int nthreads) {
    return ls_attention_ex(q, ldq, k_cache, Hkv * D, v_cache, Hkv * D, S, slots, seq_off, B,
                           row_seq, row_nkeys, window, scale, 0.0f, NULL, out, T, H, Hkv, D,
                           D, nthreads);
}

// the f16 KV pool (llama.cpp numerics): its own header, same unit
#include "attention_f16.h"
