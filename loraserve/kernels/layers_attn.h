// layers.c's attention layer (block.py's attention, one row of it per token): q|k|v (each q
// head followed by its output gate where the model has them), q and k normed and rotated
// (all of each head, or its first rope_dim dims), the KV write, attention, the output gate,
// the output projection. Included by layers.c alone, after layers_proj.h.
#include <math.h>
#include <string.h>

#include "layers.h"

// x [T, H, D] contiguous, in place: each head's first n_rot dims rotated by cos/sin
// [T, n_rot/2], pairs (2i, 2i+1) or (i, i + n_rot/2), as attn/variants.py's partial_rope
// computes them (each product rounded, then the difference or sum).
static void rope_part(float *x, int64_t T, int64_t H, int64_t D, int64_t n_rot, int pairs,
                      const float *cos, const float *sin) {
    const int64_t half = n_rot / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            float *r = x + (t * H + h) * D;
            for (int64_t i = 0; i < half; i++) {
                const float c = cos[t * half + i], s = sin[t * half + i];
                const int64_t i0 = pairs ? 2 * i : i, i1 = pairs ? 2 * i + 1 : i + half;
                const float x0 = r[i0], x1 = r[i1];
                r[i0] = x0 * c - x1 * s;
                r[i1] = x0 * s + x1 * c;
            }
        }
}

int ls_sigmoid_gate(const float *a, int64_t lda, const float *g, int64_t ldg, int64_t hsg,
                    int64_t T, int64_t H, int64_t D, float *out) {
    if (T < 0 || H < 1 || D < 1 || lda < H * D || hsg < D || !a || !g || !out) return -3;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < D; j++) {
                const double x = g[t * ldg + h * hsg + j];
                const float s = (float)(1.0 / (1.0 + exp(-x)));
                out[(t * H + h) * D + j] = a[t * lda + h * D + j] * s;
            }
    return 0;
}

// The attention of layer i for h [T, hidden] -> a [T, hidden]: q|k|v (with output gates: q,
// k and v gathered into qg first, as block.py's cat), q and k normed and rotated into qk (or,
// without rope and norm, read where projected), the new keys and values written to the pools,
// attention, the output gate, the output projection.
static int attn_layer(const ls_model_t *m, const ls_layer_t *L, const ls_step_t *st,
                      int64_t i, const float *h, float *qkv, float *qg, float *qk, float *att,
                      float *a, int64_t T, int nthreads) {
    const int64_t Hd = m->hidden, nq = m->n_heads, nkv = m->n_kv, D = m->head_dim;
    const int64_t nqkv = (nq + 2 * nkv) * D, nproj = L->qkv.n_out, nqk = nq + nkv;
    int rc = proj(&L->qkv, h, Hd, T, qkv, st->lora, LS_PROJS * i, nthreads);
    if (rc != 0) return rc;
    const float *src = qkv;  // q|k|v rows of lds values
    int64_t lds = nproj;
    if (m->out_gate) {
        for (int64_t t = 0; t < T; t++) {
            for (int64_t hh = 0; hh < nq; hh++)
                memcpy(qg + t * nqkv + hh * D, qkv + t * nproj + hh * 2 * D, sizeof(float) * D);
            memcpy(qg + t * nqkv + nq * D, qkv + t * nproj + 2 * nq * D,
                   sizeof(float) * 2 * nkv * D);
        }
        src = qg;
        lds = nqkv;
    }
    const float *q = src;
    int64_t ldq = lds;
    const float *cos = L->sliding ? st->cos_l : st->cos_g, *sin = L->sliding ? st->sin_l : st->sin_g;
    if (L->rope && m->rope_dim < D) {  // the norm, then the first rope_dim dims rotated
        if (L->qk_norm != NULL)
            ls_rms_norm(src, T, nqk, D, lds, L->qk_norm, nqk, m->eps, qk, nthreads);
        else
            for (int64_t t = 0; t < T; t++)
                memcpy(qk + t * nqk * D, src + t * lds, sizeof(float) * nqk * D);
        rope_part(qk, T, nqk, D, m->rope_dim, m->rope_pairs, cos, sin);
        q = qk;
        ldq = nqk * D;
    } else if (L->rope) {
        ls_norm_rope(src, T, nqk, D, lds, L->qk_norm, L->qk_norm ? nqk : 1, m->eps, cos, sin, qk,
                     nthreads);
        q = qk;
        ldq = nqk * D;
    }
    float *kc = st->k_caches[i], *vc = st->v_caches[i];
    for (int64_t t = 0; t < T; t++) {  // the new keys (normed, rotated) and values
        const int64_t s = st->slot_mapping[t];
        if (s < 0 || s >= st->S) return -1;
        memcpy(kc + s * nkv * D, q + t * ldq + nq * D, sizeof(float) * nkv * D);
        memcpy(vc + s * nkv * D, src + t * lds + nqk * D, sizeof(float) * nkv * D);
    }
    rc = ls_attention(q, ldq, kc, vc, st->S, st->slots, st->seq_off, st->B, st->row_seq,
                      st->row_nkeys, L->sliding ? st->window : 0, m->attn_scale, att, T, nq, nkv,
                      D, nthreads);
    if (rc != 0) return rc;
    if (m->out_gate)  // in place: each value read before it is written
        ls_sigmoid_gate(att, nq * D, qkv + D, nproj, 2 * D, T, nq, D, att);
    return proj(&L->o, att, nq * D, T, a, st->lora, LS_PROJS * i + 1, nthreads);
}
