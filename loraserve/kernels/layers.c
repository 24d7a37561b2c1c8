// A decoder's layers in one call, LoRA deltas included: the Python loop over layers (about
// 10 kernel calls and 40 tensor ops per layer, 5-7 ms of a 25 ms Gemma 270M decode step)
// becomes one C call. Layers attend (qwen35: with output gates and a partial rope), or run a
// Mamba-2 (granitehybrid, mamba2, nemotron-h), gated delta-net (qwen35) or short-convolution
// (lfm2) mixer in place of attention or beside it (falcon-h1: Mamba-2) for decode steps (each
// row the one new row of its sequence), or no mixer; their FFN is gated, relu(up)^2
// (nemotron-h) or absent.
//
// Same bits as the Python path, by construction: this file is linked with the kernels'
// sources into one library and calls the very functions the Python path calls, with the
// same arguments, in the same order (RMSNorm, the quantized projections, norm+rope, the KV
// write, attention, the Mamba-2 and delta-net steps, the gated activation, the scaled
// residual adds), so a sequence's numbers do not depend on whether its step had an adapter
// elsewhere in the batch (tests compare both paths bitwise).

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "layers_proj.h"
#include "layers_attn.h"
#include "layers_conv.h"

// Whether the model's sizes fit each other: positive widths, heads that group, and every
// layer's projections, norms, KV pools or Mamba-2 tensors and states of the widths the
// buffers below are sized for.
// Whether Mamba-2 mixer mb with projections pin (ssm_in) and pout (ssm_out) fits hidden Hd
// and the step has state records.
static int mamba_fits(const ls_mamba_t *mb, const ls_proj_t *pin, const ls_proj_t *pout,
                      int64_t Hd, const ls_step_t *st) {
    const int64_t di = mb->H * mb->P, C = di + 2 * mb->G * mb->N;
    return mb->H >= 1 && mb->P >= 1 && mb->N >= 1 && mb->G >= 1 && mb->L >= 2 && mb->taps &&
           mb->ones && mb->d && mb->dt_b && mb->a && st->st_in && st->st_out &&
           proj_fits(pin, Hd, di + C + mb->H) && proj_fits(pout, di, Hd);
}

static int model_fits(const ls_model_t *m, const ls_step_t *st, int64_t T) {
    const int64_t Hd = m->hidden, nq = m->n_heads, nkv = m->n_kv, D = m->head_dim, F = m->ffn;
    if (T < 0 || m->n_layers < 0 || Hd < 1 || nq < 1 || nkv < 1 || nq % nkv || D < 2 || D % 2 ||
        F < 1 || st->S < 0 || st->B < 0 || m->rope_dim < 2 || m->rope_dim > D || m->rope_dim % 2)
        return 0;
    for (int64_t i = 0; i < m->n_layers; i++) {
        const ls_layer_t *L = &m->layers[i];
        const ls_mamba_t *mb = L->mamba;
        const int kinds = (mb != NULL) + (L->gdn != NULL) + (L->conv != NULL) + !!L->no_mixer;
        if (kinds > 1 || (L->no_mixer != 0 && L->no_mixer != 1) || L->ffn_form < LS_FFN_GATED ||
            L->ffn_form > LS_FFN_RELU_SQR || (L->no_mixer && L->ffn_form == LS_FFN_NONE) ||
            (L->beside != 0 && L->beside != 1) || (L->beside && mb == NULL))
            return 0;
        if (L->beside && !mamba_fits(mb, &L->ssm_in, &L->ssm_out, Hd, st)) return 0;
        if (L->no_mixer) {
            if (L->qk_norm != NULL) return 0;
        } else if (mb != NULL && !L->beside) {
            if (!mamba_fits(mb, &L->qkv, &L->o, Hd, st) || L->qk_norm != NULL) return 0;
        } else if (L->gdn != NULL) {
            const ls_gdn_t *g = L->gdn;
            const int64_t vs = g->Hv * g->S;
            if (g->Hk < 1 || g->Hv < 1 || g->Hv % g->Hk || g->S < 1 || g->L < 2 || !st->st_in ||
                !st->st_out || !proj_fits(&L->qkv, Hd, 2 * g->Hk * g->S + 2 * vs + 2 * g->Hv) ||
                !proj_fits(&L->o, vs, Hd) || L->qk_norm != NULL)
                return 0;
        } else if (L->conv != NULL) {
            const ls_conv_t *cv = L->conv;
            if (cv->C < 1 || cv->L < 2 || !cv->taps || !st->st_in || !st->st_out ||
                !proj_fits(&L->qkv, Hd, 3 * cv->C) || !proj_fits(&L->o, cv->C, Hd) ||
                L->qk_norm != NULL)
                return 0;
        } else if (!proj_fits(&L->qkv, Hd, (nq + 2 * nkv) * D + (m->out_gate ? nq * D : 0)) ||
                   !proj_fits(&L->o, nq * D, Hd) || st->k_caches[i] == NULL ||
                   st->v_caches[i] == NULL || (!L->rope && L->qk_norm != NULL)) {
            return 0;
        }
        const int64_t up = L->ffn_form == LS_FFN_GATED ? 2 * F : F;
        if (L->ffn_form != LS_FFN_NONE &&
            (!proj_fits(&L->gate_up, Hd, up) || !proj_fits(&L->down, F, Hd)))
            return 0;
        const float *norms[5] = {L->attn_norm, L->qk_norm, L->post_attn_norm, L->ffn_norm,
                                 L->post_ffn_norm};
        const int64_t want[5] = {Hd, (nq + nkv) * D, Hd, Hd, Hd};
        for (int k = 0; k < 5; k++)  // attn_norm always, ffn_norm where the layer has an FFN
            if (norms[k] == NULL ? (k == 0 || (k == 3 && L->ffn_form != LS_FFN_NONE))
                                 : L->norm_n[k] != want[k])
                return 0;
    }
    return 1;
}

// The Mamba-2 mixer of layer i for h [T, hidden] -> a [T, hidden] (recurrent/mamba2.py's
// `_step`): ssm_in, the step sizes (ls_ssm_dt), the step (ls_mamba2_step: conv, scan, D skip,
// gate, grouped norm; each row's sequence's state record st_in -> st_out), ssm_out. Its
// projections are the layer's qkv and o, or ssm_in and ssm_out beside attention.
static int mamba_mixer(const ls_model_t *m, const ls_layer_t *L, const ls_step_t *st,
                       int64_t i, const float *h, float *zx, float *y, float *a, int64_t T,
                       int nthreads) {
    const ls_mamba_t *mb = L->mamba;
    const ls_proj_t *pin = L->beside ? &L->ssm_in : &L->qkv;
    const ls_proj_t *pout = L->beside ? &L->ssm_out : &L->o;
    const int64_t slot = LS_PROJS * i + (L->beside ? 4 : 0);
    const int64_t di = mb->H * mb->P, n_in = pin->n_out;
    int rc = proj(pin, h, m->hidden, T, zx, st->lora, slot, nthreads);
    if (rc != 0) return rc;
    float *dt = malloc(sizeof(float) * (size_t)(2 * T * mb->H));
    if (!dt) return -2;
    rc = ls_ssm_dt(zx + (n_in - mb->H), n_in, T, mb->H, mb->dt_b, mb->a, dt, dt + T * mb->H);
    if (rc == 0)
        rc = ls_mamba2_step(zx, n_in, dt, dt + T * mb->H, T, st->st_in + i * T,
                            st->st_out + i * T, mb->taps, mb->conv_b, mb->ones, mb->d, mb->norm,
                            m->eps, mb->H, mb->P, mb->N, mb->G, mb->L, y, m->vl, nthreads);
    free(dt);
    if (rc != 0) return rc == -2 ? -2 : -3;
    return proj(pout, y, di, T, a, st->lora, slot + 1, nthreads);
}

// The gated delta-net mixer of layer i for h [T, hidden] -> a [T, hidden]
// (recurrent/deltanet.py's `_step`): the in-projection (q|k|v, z, beta|alpha), the step
// (ls_gdn_step: conv, q/k norms, gates, recurrence, output norm and gate; each row's
// sequence's state record st_in -> st_out), ssm_out.
static int gdn_mixer(const ls_model_t *m, const ls_layer_t *L, const ls_step_t *st, int64_t i,
                     const float *h, float *mixed, float *y, float *a, int64_t T, int nthreads) {
    int rc = proj(&L->qkv, h, m->hidden, T, mixed, st->lora, LS_PROJS * i, nthreads);
    if (rc != 0) return rc;
    rc = ls_gdn_step(mixed, L->qkv.n_out, T, st->st_in + i * T, st->st_out + i * T, L->gdn, y,
                     nthreads);
    if (rc != 0) return rc == -2 ? -2 : -3;
    return proj(&L->o, y, L->gdn->Hv * L->gdn->S, T, a, st->lora, LS_PROJS * i + 1, nthreads);
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
    int64_t w_in = nqkv, w_mid = nq * D;  // the widest mixer input and output rows
    for (int64_t i = 0; i < m->n_layers; i++) {
        const ls_layer_t *L = &m->layers[i];
        if (L->qkv.n_out > w_in) w_in = L->qkv.n_out;
        if (L->beside && L->ssm_in.n_out > w_in) w_in = L->ssm_in.n_out;
        if (L->mamba != NULL && L->mamba->H * L->mamba->P > w_mid)
            w_mid = L->mamba->H * L->mamba->P;
        if (L->gdn != NULL && L->gdn->Hv * L->gdn->S > w_mid) w_mid = L->gdn->Hv * L->gdn->S;
        if (L->conv != NULL && L->conv->C > w_mid) w_mid = L->conv->C;
    }
    float *h = malloc(sizeof(float) * (size_t)(T * Hd));
    float *qkv = malloc(sizeof(float) * (size_t)(T * w_in));
    float *qk = malloc(sizeof(float) * (size_t)(T * (nq + nkv) * D));
    float *qg = malloc(sizeof(float) * (size_t)(T * nqkv));  // q|k|v without output gates
    float *att = malloc(sizeof(float) * (size_t)(T * w_mid));
    float *a = malloc(sizeof(float) * (size_t)(T * Hd));
    float *a2 = malloc(sizeof(float) * (size_t)(T * Hd));
    float *gu = malloc(sizeof(float) * (size_t)(T * 2 * F));
    float *f = malloc(sizeof(float) * (size_t)(T * F));
    const float rs = m->res_scale;
    int rc = -2;
    if (!h || !qkv || !qk || !qg || !att || !a || !a2 || !gu || !f) goto done;
    rc = 0;
    for (int64_t i = 0; i < m->n_layers && rc == 0; i++) {
        const ls_layer_t *L = &m->layers[i];
        if (!L->no_mixer) {
            ls_rms_norm(x, T, 1, Hd, Hd, L->attn_norm, 1, m->eps, h, nthreads);
            if (L->mamba != NULL && !L->beside)
                rc = mamba_mixer(m, L, st, i, h, qkv, att, a, T, nthreads);
            else if (L->gdn != NULL)
                rc = gdn_mixer(m, L, st, i, h, qkv, att, a, T, nthreads);
            else if (L->conv != NULL)
                rc = conv_mixer(m, L, st, i, h, qkv, att, a, T, nthreads);
            else
                rc = attn_layer(m, L, st, i, h, qkv, qg, qk, att, a, T, nthreads);
            if (rc == 0 && L->beside) {  // attention's output + the mixer's (block.py's order)
                rc = mamba_mixer(m, L, st, i, h, qkv, att, a2, T, nthreads);
                for (int64_t k = 0; rc == 0 && k < T * Hd; k++) a[k] = a[k] + a2[k];
            }
            if (rc != 0) break;
            if (L->post_attn_norm != NULL) {
                ls_rms_norm(a, T, 1, Hd, Hd, L->post_attn_norm, 1, m->eps, a2, nthreads);
                add_rows(x, a2, T * Hd, rs);
            } else {
                add_rows(x, a, T * Hd, rs);
            }
        }
        if (L->ffn_form == LS_FFN_NONE) continue;
        ls_rms_norm(x, T, 1, Hd, Hd, L->ffn_norm, 1, m->eps, h, nthreads);
        if ((rc = ffn_branch(m, L, st, i, h, gu, f, a, T, nthreads)) != 0) break;
        if (L->post_ffn_norm != NULL) {
            ls_rms_norm(a, T, 1, Hd, Hd, L->post_ffn_norm, 1, m->eps, a2, nthreads);
            add_rows(x, a2, T * Hd, rs);
        } else {
            add_rows(x, a, T * Hd, rs);
        }
    }
done:
    free(h);
    free(qkv);
    free(qk);
    free(qg);
    free(att);
    free(a);
    free(a2);
    free(gu);
    free(f);
    return rc;
}
