// layers.c's short-convolution mixer (recurrent/shortconv.py's `forward` for a decode step:
// each row the one new row of its sequence) and the feed-forward branch (block.py's `_ffn`:
// gated, or relu(up)^2 without a gate). Included by layers.c alone, after layers_proj.h.
#include <string.h>

#include "layers.h"

// Whether layer i's state records are there for each of the T rows (before and after).
static int records_there(const ls_step_t *st, int64_t i, int64_t T) {
    for (int64_t q = 0; q < T; q++)
        if (!st->st_in[i * T + q] || !st->st_out[i * T + q]) return 0;
    return 1;
}

// The short-convolution mixer of layer i for h [T, hidden] -> a [T, hidden]: in_proj's b|c|x
// [T, 3 C], bx = b x, the causal conv over each row's sequence's last L-1 bx rows (its state
// record st_in [L-1, C]) and the new one, taps j = 0..L-1 in order (each product rounded, then
// the sum: causal_conv's order), the last L-1 rows into st_out, c times the conv, out_proj.
static int conv_mixer(const ls_model_t *m, const ls_layer_t *L, const ls_step_t *st, int64_t i,
                      const float *h, float *bcx, float *y, float *a, int64_t T, int nthreads) {
    const ls_conv_t *cv = L->conv;
    const int64_t C = cv->C, K = cv->L;
    const float *w = cv->taps;
    if (!records_there(st, i, T)) return -3;
    int rc = proj(&L->qkv, h, m->hidden, T, bcx, st->lora, LS_PROJS * i, nthreads);
    if (rc != 0) return rc;
    for (int64_t q = 0; q < T; q++) {
        const float *si = st->st_in[i * T + q], *b = bcx + q * 3 * C, *c = b + C, *x = c + C;
        float *so = st->st_out[i * T + q], *yq = y + q * C;
        for (int64_t ch = 0; ch < C; ch++) {
            const float bx = b[ch] * x[ch];
            float acc = si[ch] * w[ch];
            for (int64_t j = 1; j < K - 1; j++) acc = acc + si[j * C + ch] * w[j * C + ch];
            acc = acc + bx * w[(K - 1) * C + ch];
            yq[ch] = c[ch] * acc;
            so[(K - 2) * C + ch] = bx;
        }
        memmove(so, si + C, sizeof(float) * (size_t)((K - 2) * C));
    }
    return proj(&L->o, y, C, T, a, st->lora, LS_PROJS * i + 1, nthreads);
}

// Layer i's feed-forward of the normed h [T, hidden] -> a [T, hidden]: gate_up, then act(gate)
// * up (ls_gated_act) or relu(up)^2 (torch.relu, then r * r: a NaN stays one), then down.
static int ffn_branch(const ls_model_t *m, const ls_layer_t *L, const ls_step_t *st, int64_t i,
                      const float *h, float *gu, float *f, float *a, int64_t T, int nthreads) {
    const int64_t Hd = m->hidden, F = m->ffn;
    int rc = proj(&L->gate_up, h, Hd, T, gu, st->lora, LS_PROJS * i + 2, nthreads);
    if (rc != 0) return rc;
    if (L->ffn_form == LS_FFN_RELU_SQR) {
        for (int64_t k = 0; k < T * F; k++) {
            const float r = gu[k] < 0.0f ? 0.0f : gu[k];
            f[k] = r * r;
        }
    } else if (ls_gated_act(gu, gu + F, T, F, 2 * F, m->act, f, nthreads) != 0) {
        return -3;
    }
    return proj(&L->down, f, F, T, a, st->lora, LS_PROJS * i + 3, nthreads);
}
