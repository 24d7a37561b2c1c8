// layers.c's projections: the quantized matmul, bias and LoRA deltas of one projection
// (`proj`, Projection.forward's order) and the residual add. Included by layers.c alone.
#include <stdlib.h>

#include "layers.h"

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

// x += a, or x += a * rs (block.py's x + a * rs: the product rounded, then the sum)
static void add_rows(float *x, const float *a, int64_t n, float rs) {
    if (rs == 1.0f)
        for (int64_t i = 0; i < n; i++) x[i] = x[i] + a[i];
    else
        for (int64_t i = 0; i < n; i++) x[i] = x[i] + a[i] * rs;
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
