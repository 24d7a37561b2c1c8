// A dense decoder's layers in one call, LoRA deltas included: the Python loop over layers
// (about 10 kernel calls and 40 tensor ops per layer, 5-7 ms of a 25 ms Gemma 270M decode
// step) becomes one C call.
//
// Same bits as the Python path, by construction: this file is linked with the kernels'
// sources into one library and calls the very functions the Python path calls, with the
// same arguments, in the same order (RMSNorm, the quantized projections, norm+rope, the KV write, attention,
// the gated activation, the residual adds), so a sequence's numbers do not depend on
// whether its step had an adapter elsewhere in the batch (tests compare both paths bitwise).

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// the kernels of qmatmul.c, rowops.c and attention.c (documented there)
int ls_qmatmul_multi_f32(int nparts, const int *types, const uint8_t *const *ws,
                         const int64_t *ns, const int64_t *row_bytes, const int64_t *cols,
                         int64_t K, const float *x, int64_t ldx, int64_t M, float *y,
                         int64_t ldy, int nthreads);
int ls_rms_norm(const float *x, int64_t T, int64_t H, int64_t K, int64_t ldt, const float *w,
                int64_t HW, float eps, float *y, int nthreads);
int ls_norm_rope(const float *x, int64_t T, int64_t H, int64_t K, int64_t ldt, const float *w,
                 int64_t HW, float eps, const float *cos, const float *sin, float *y,
                 int nthreads);
int ls_attention(const float *q, int64_t ldq, const float *k_cache, const float *v_cache,
                 int64_t S, const int64_t *slots, const int64_t *seq_off, int64_t B,
                 const int32_t *row_seq, const int32_t *row_nkeys, int32_t window, float scale,
                 float *out, int64_t T, int64_t H, int64_t Hkv, int64_t D, int nthreads);
int ls_gated_act(const float *g, const float *u, int64_t T, int64_t F, int64_t ld, int act,
                 float *out, int nthreads);
int ls_lora(int n_ad, const float *const *as, const float *const *bs, const float *const *bts,
            const int64_t *ranks, const float *s, const float *x, int64_t ldx, int64_t T,
            int64_t K, float *y, int64_t ldy, int64_t N, int nthreads);
int ls_lora16(int n_ad, const uint16_t *const *as16, const uint16_t *const *tails,
              const uint16_t *const *bt16s, const int64_t *ranks, const float *s,
              const float *x, int64_t ldx, int64_t T, int64_t K, float *y, int64_t ldy,
              int64_t N, int nthreads);

// One projection: up to 8 quantized matrices of one input side by side (q|k|v, gate|up).
typedef struct {
    int32_t nparts;
    int types[8];
    const uint8_t *ws[8];
    int64_t ns[8], row_bytes[8], cols[8];
    int64_t n_out;
    const float *bias;  // [n_out] or NULL
} ls_proj_t;

typedef struct {
    ls_proj_t qkv, o, gate_up, down;
    const float *attn_norm;       // [hidden]
    const float *qk_norm;         // [nq + nkv, D] or NULL
    const float *post_attn_norm;  // [hidden] or NULL
    const float *ffn_norm;        // [hidden]
    const float *post_ffn_norm;   // [hidden] or NULL
    int32_t sliding;              // 1: local rope tables and the sliding window
    int64_t norm_n[5];  // the five norms' value counts, in the order above (0 for NULL)
} ls_layer_t;

typedef struct {
    int64_t n_layers, hidden, n_heads, n_kv, head_dim, ffn;
    float eps, attn_scale;
    int32_t act;  // 0 SiLU, 1 GELU-tanh
    const ls_layer_t *layers;
} ls_model_t;

// One LoRA target of one adapter: float32 (a, b, bt) or, when the adapter's values are
// halves, float16 alone (a16, bt16, tail16; a and b NULL); neither: the adapter does not
// target this part.
typedef struct {
    const float *a, *b;  // A [rank, in], B [out, rank] float32 contiguous
    int64_t rank;
    float factor;  // multiplies the user scale
    const float *bt;  // B transposed [rank, out] (ls_lora's faster route, the same bits)
    int64_t in, out;  // A's and B's widths: the part's input width and its row count
    // A, B in 8-output tiles and B's rows past the last whole tile, as float16: ls_lora16
    // reads them, half the bytes, the same bits (lora16.c)
    const uint16_t *a16, *bt16, *tail16;
} ls_lora_w;

// The step's adapters (ascending id, as LoraBatch orders them): table [n_active, T] each
// row's user scale (0: not in its mix); ad[j] [n_layers * 4 * 8] adapter j's targets per
// (layer, projection qkv/o/gate_up/down, part).
typedef struct {
    int32_t n_active;
    const float *table;
    const ls_lora_w *const *ad;
} ls_lora_t;

// One step's metadata (the runner's StepContext, as the Python path reads it).
typedef struct {
    const int64_t *slot_mapping;  // [T] KV slot of each new token
    const int64_t *slots;         // every sequence's KV slots, in position order
    const int64_t *seq_off;       // [B + 1]
    int64_t B;
    const int32_t *row_seq, *row_nkeys;  // [T]
    int32_t window;
    const float *cos_g, *sin_g, *cos_l, *sin_l;  // [T, D/2] global and local rope tables
    float *const *k_caches;  // [n_layers] pools [S, Hkv, D] float32
    float *const *v_caches;
    int64_t S;
    const ls_lora_t *lora;  // NULL: no adapter in the step
} ls_step_t;

// y = x W^T (+ bias), then each part's LoRA delta, as Projection.forward does: the parts in
// order, each with its adapters in ascending id and scales table * factor (LoraBatch).
static int proj(const ls_proj_t *p, const float *x, int64_t K, int64_t T, float *y,
                const ls_lora_t *lo, int64_t slot, int nthreads) {
    int rc = ls_qmatmul_multi_f32(p->nparts, p->types, p->ws, p->ns, p->row_bytes, p->cols, K,
                                  x, K, T, y, p->n_out, nthreads);
    if (rc == 0 && p->bias != NULL)
        for (int64_t t = 0; t < T; t++)
            for (int64_t n = 0; n < p->n_out; n++) y[t * p->n_out + n] += p->bias[n];
    if (rc != 0 || lo == NULL || lo->n_active == 0) return rc;
    const int64_t na = lo->n_active;
    const float **as = malloc(sizeof(float *) * (size_t)na);
    const float **bs = malloc(sizeof(float *) * (size_t)na);
    const float **bts = malloc(sizeof(float *) * (size_t)na);
    int64_t *ranks = malloc(sizeof(int64_t) * (size_t)na);
    float *sc = malloc(sizeof(float) * (size_t)(na * T));
    const uint16_t **as16 = malloc(sizeof(uint16_t *) * (size_t)na);
    const uint16_t **bt16s = malloc(sizeof(uint16_t *) * (size_t)na);
    const uint16_t **tails = malloc(sizeof(uint16_t *) * (size_t)na);
    char *half = malloc((size_t)na + 1);
    if (!as || !bs || !bts || !ranks || !sc || !as16 || !bt16s || !tails || !half) rc = -2;
    for (int k = 0; k < p->nparts && rc == 0; k++) {
        int n = 0;
        for (int j = 0; j < na; j++) {
            const ls_lora_w *w = &lo->ad[j][slot * 8 + k];
            if (w->a == NULL && w->a16 == NULL) continue;
            if (w->in != K || w->out != p->ns[k] || w->rank < 1 ||
                (w->a == NULL && (w->bt16 == NULL || (w->out % 8 && w->tail16 == NULL)))) {
                rc = -3;  // an adapter that does not fit this part
                break;
            }
            as[n] = w->a;
            bs[n] = w->b;
            bts[n] = w->bt;
            as16[n] = w->a16;
            bt16s[n] = w->bt16;
            tails[n] = w->tail16;
            half[n] = w->a == NULL;  // halves alone: the float16 route
            ranks[n] = w->rank;
            for (int64_t t = 0; t < T; t++) sc[n * T + t] = lo->table[j * T + t] * w->factor;
            n++;
        }
        // each run of adapters of one kind in one call, the runs in order: every output
        // adds each adapter's delta in the order of the ids as one call would (a call's
        // threads and column ranges change no output's operations)
        for (int i = 0; i < n && rc == 0;) {
            int e = i;
            while (e < n && half[e] == half[i]) e++;
            float *yk = y + p->cols[k];
            if (half[i])
                rc = ls_lora16(e - i, as16 + i, tails + i, bt16s + i, ranks + i, sc + i * T, x,
                               K, T, K, yk, p->n_out, p->ns[k], nthreads);
            else
                rc = ls_lora(e - i, as + i, bs + i, bts + i, ranks + i, sc + i * T, x, K, T, K,
                             yk, p->n_out, p->ns[k], nthreads);
            i = e;
        }
    }
    free(half);
    free(tails);
    free(as16);
    free(bt16s);
    free(as);
    free(bs);
    free(bts);
    free(ranks);
    free(sc);
    return rc;
}

static void add_rows(float *x, const float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + a[i];
}

// Whether projection p maps K inputs to n_out outputs: 1 to 8 parts side by side that
// cover its columns, each no wider than its place (the rows' lengths against K are the
// matmul's own check).
static int proj_fits(const ls_proj_t *p, int64_t K, int64_t n_out) {
    if (p->n_out != n_out || p->nparts < 1 || p->nparts > 8 || K < 1) return 0;
    int64_t end = 0;
    for (int k = 0; k < p->nparts; k++) {
        if (p->cols[k] != end || p->ns[k] < 1) return 0;
        end += p->ns[k];
    }
    return end == n_out;
}

// Whether the model's sizes fit each other: positive widths, heads that group, and every
// layer's projections, norms and KV pools of the widths the buffers below are sized for.
static int model_fits(const ls_model_t *m, const ls_step_t *st, int64_t T) {
    const int64_t Hd = m->hidden, nq = m->n_heads, nkv = m->n_kv, D = m->head_dim, F = m->ffn;
    if (T < 0 || m->n_layers < 0 || Hd < 1 || nq < 1 || nkv < 1 || nq % nkv || D < 2 || D % 2 ||
        F < 1 || st->S < 0 || st->B < 0)
        return 0;
    for (int64_t i = 0; i < m->n_layers; i++) {
        const ls_layer_t *L = &m->layers[i];
        if (!proj_fits(&L->qkv, Hd, (nq + 2 * nkv) * D) || !proj_fits(&L->o, nq * D, Hd) ||
            !proj_fits(&L->gate_up, Hd, 2 * F) || !proj_fits(&L->down, F, Hd))
            return 0;
        const float *norms[5] = {L->attn_norm, L->qk_norm, L->post_attn_norm, L->ffn_norm,
                                 L->post_ffn_norm};
        const int64_t want[5] = {Hd, (nq + nkv) * D, Hd, Hd, Hd};
        for (int k = 0; k < 5; k++)
            if (norms[k] == NULL ? (k == 0 || k == 3) : L->norm_n[k] != want[k]) return 0;
        if (st->k_caches[i] == NULL || st->v_caches[i] == NULL) return 0;
    }
    return 1;
}

// x [T, hidden] float32, in place: every layer of the model for the step's T token rows.
// Returns 0, -1 (a kernel refused its type or the metadata), -2 (out of memory), -3 (sizes
// that do not fit: a projection, norm or adapter of another width than the model's, checked
// before any buffer is sized).
int ls_decoder_layers(const ls_model_t *m, const ls_step_t *st, float *x, int64_t T,
                      int nthreads) {
    if (!model_fits(m, st, T)) return -3;
    const int64_t Hd = m->hidden, nq = m->n_heads, nkv = m->n_kv, D = m->head_dim;
    const int64_t nqkv = (nq + 2 * nkv) * D, F = m->ffn;
    float *h = malloc(sizeof(float) * (size_t)(T * Hd));
    float *qkv = malloc(sizeof(float) * (size_t)(T * nqkv));
    float *qk = malloc(sizeof(float) * (size_t)(T * (nq + nkv) * D));
    float *att = malloc(sizeof(float) * (size_t)(T * nq * D));
    float *a = malloc(sizeof(float) * (size_t)(T * Hd));
    float *a2 = malloc(sizeof(float) * (size_t)(T * Hd));
    float *gu = malloc(sizeof(float) * (size_t)(T * 2 * F));
    float *f = malloc(sizeof(float) * (size_t)(T * F));
    int rc = -2;
    if (!h || !qkv || !qk || !att || !a || !a2 || !gu || !f) goto done;
    rc = 0;
    for (int64_t i = 0; i < m->n_layers && rc == 0; i++) {
        const ls_layer_t *L = &m->layers[i];
        ls_rms_norm(x, T, 1, Hd, Hd, L->attn_norm, 1, m->eps, h, nthreads);
        if ((rc = proj(&L->qkv, h, Hd, T, qkv, st->lora, 4 * i, nthreads)) != 0) break;
        ls_norm_rope(qkv, T, nq + nkv, D, nqkv, L->qk_norm, L->qk_norm ? nq + nkv : 1, m->eps,
                     L->sliding ? st->cos_l : st->cos_g, L->sliding ? st->sin_l : st->sin_g, qk,
                     nthreads);
        float *kc = st->k_caches[i], *vc = st->v_caches[i];
        for (int64_t t = 0; t < T; t++) {  // the new keys (normed, rotated) and values
            const int64_t s = st->slot_mapping[t];
            if (s < 0 || s >= st->S) { rc = -1; break; }
            memcpy(kc + s * nkv * D, qk + (t * (nq + nkv) + nq) * D, sizeof(float) * nkv * D);
            memcpy(vc + s * nkv * D, qkv + t * nqkv + (nq + nkv) * D, sizeof(float) * nkv * D);
        }
        if (rc != 0) break;
        rc = ls_attention(qk, (nq + nkv) * D, kc, vc, st->S, st->slots, st->seq_off, st->B,
                          st->row_seq, st->row_nkeys, L->sliding ? st->window : 0,
                          m->attn_scale, att, T, nq, nkv, D, nthreads);
        if (rc != 0) break;
        if ((rc = proj(&L->o, att, nq * D, T, a, st->lora, 4 * i + 1, nthreads)) != 0) break;
        if (L->post_attn_norm != NULL) {
            ls_rms_norm(a, T, 1, Hd, Hd, L->post_attn_norm, 1, m->eps, a2, nthreads);
            add_rows(x, a2, T * Hd);
        } else {
            add_rows(x, a, T * Hd);
        }
        ls_rms_norm(x, T, 1, Hd, Hd, L->ffn_norm, 1, m->eps, h, nthreads);
        if ((rc = proj(&L->gate_up, h, Hd, T, gu, st->lora, 4 * i + 2, nthreads)) != 0) break;
        ls_gated_act(gu, gu + F, T, F, 2 * F, m->act, f, nthreads);
        if ((rc = proj(&L->down, f, F, T, a, st->lora, 4 * i + 3, nthreads)) != 0) break;
        if (L->post_ffn_norm != NULL) {
            ls_rms_norm(a, T, 1, Hd, Hd, L->post_ffn_norm, 1, m->eps, a2, nthreads);
            add_rows(x, a2, T * Hd);
        } else {
            add_rows(x, a, T * Hd);
        }
    }
done:
    free(h);
    free(qkv);
    free(qk);
    free(att);
    free(a);
    free(a2);
    free(gu);
    free(f);
    return rc;
}
