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
// Headers of this unit: attention_item.h (one work item: scores, softmax, weighted sum),
// attention_f16.h (the f16 KV pool with llama.cpp's numerics).
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
#include "attention_item.h"

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
        seq_off[0] < 0 || ldq < H * D || ldk < Hkv * D || ldv < Hkv * Dv)
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
// latent attention's query rows and cache rows (deepseek2)
#include "mla_prep.h"
