// The per-thread stages of a grouped expert call (moe.c), each inside its parallel region:
// the inputs quantized into sorted rows, the gated activation, the weighted combine.

#pragma once

// The input rows of a projection, quantized into b in sorted order: sorted row s is input
// row src[s] (src NULL: row s) times scale[s] (scale NULL: as it is). Without a scale, the
// R input rows are quantized once into tmp and copied (k slots of a token share them).
static void st_quant(const abuf_t *b, const abuf_t *tmp, const float *x, int64_t ldx,
                     int64_t R, int64_t P, const int64_t *src, const float *scale, float *row,
                     int64_t E, const int64_t *off) {
    if (src == NULL || scale != NULL) {
#pragma omp for schedule(static)
        for (int64_t s = 0; s < P; s++) {
            const float *xr = x + (src == NULL ? s : src[s]) * ldx;
            if (scale != NULL) {
                for (int64_t c = 0; c < b->K; c++) row[c] = xr[c] * scale[s];
                xr = row;
            }
            quant_row(b, s, xr);
        }
    } else {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) quant_row(tmp, r, x + r * ldx);
#pragma omp for schedule(static)
        for (int64_t s = 0; s < P; s++) copy_row(b, s, tmp, src[s]);
    }
#pragma omp for schedule(static)
    for (int64_t e = 0; e < E; e++) expert_dT(b, off, e);
}

// This thread's share of the sorted rows of gu [P, 2F] (gate | up): the experts' gate and
// up biases added (gb, ub [E, F] or NULL), the gated activation into a [P, F], and, with qa,
// its rows quantized for the down projection.
static void st_act(float *gu, int64_t P, int64_t F, const int64_t *off, const float *gb,
                   const float *ub, int act, float *a, const abuf_t *qa) {
    const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t s0 = P * me / nt, s1 = P * (me + 1) / nt;
    if (s1 <= s0) return;
    int64_t e = 0;
    if (gb != NULL || ub != NULL)
        for (int64_t s = s0; s < s1; s++) {
            while (off[e + 1] <= s) e++;
            float *g = gu + s * 2 * F, *u = g + F;
            if (gb != NULL)
                for (int64_t f = 0; f < F; f++) g[f] = g[f] + gb[e * F + f];
            if (ub != NULL)
                for (int64_t f = 0; f < F; f++) u[f] = u[f] + ub[e * F + f];
        }
    ls_gated_act(gu + s0 * 2 * F, gu + s0 * 2 * F + F, s1 - s0, F, 2 * F, act, a + s0 * F, 1);
    if (qa != NULL)
        for (int64_t s = s0; s < s1; s++) quant_row(qa, s, a + s * F);
}

// A group's rows into b (experts e0..e1-1, sorted rows s0.. of the call; goff: their rows
// from 0): st_quant's numbers for those rows, from the tokens' rows quantized once into tmp,
// or (scale given) each token's row times its pair's scale quantized here.
static void st_quant_group(const abuf_t *b, const abuf_t *tmp, const float *x, int64_t ldx,
                           const int64_t *src, const float *scale, float *row, int64_t s0,
                           int64_t e0, int64_t e1, const int64_t *goff) {
    const int64_t Pg = goff[e1];
#pragma omp for schedule(static)
    for (int64_t s = 0; s < Pg; s++) {
        if (scale == NULL) {
            copy_row(b, s, tmp, src[s0 + s]);
            continue;
        }
        const float *xr = x + src[s0 + s] * ldx;
        for (int64_t c = 0; c < b->K; c++) row[c] = xr[c] * scale[s0 + s];
        quant_row(b, s, row);
    }
#pragma omp for schedule(static)
    for (int64_t e = e0; e < e1; e++) expert_dT(b, goff, e);
}

// This thread's share of a group's rows of gu [Pg, 2F] (experts from e0, rows by goff):
// st_act's numbers row by row (the biases added in place, the gated activation into row
// [F]), each row quantized into qa at once, so the activations [P, F] are never stored.
static void st_act_group(float *gu, int64_t F, const int64_t *goff, int64_t e0, int64_t e1,
                         const float *gb, const float *ub, int act, float *row,
                         const abuf_t *qa) {
    const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num(), Pg = goff[e1];
    int64_t e = e0;
    for (int64_t s = Pg * me / nt; s < Pg * (me + 1) / nt; s++) {
        while (goff[e + 1] <= s) e++;
        float *g = gu + s * 2 * F, *u = g + F;
        if (gb != NULL)
            for (int64_t f = 0; f < F; f++) g[f] = g[f] + gb[e * F + f];
        if (ub != NULL)
            for (int64_t f = 0; f < F; f++) u[f] = u[f] + ub[e * F + f];
        ls_gated_act(g, u, 1, F, 2 * F, act, row, 1);
        quant_row(qa, s, row);
    }
}

// Slot j of a token's sum into o [H]: its expert row r plus the down bias bb (NULL: none),
// times wt unless unweighted; slot 0 writes o, the others add to it.
static inline void combine_one(float *o, const float *r, const float *bb, const float *w,
                               float wt, int64_t j, int64_t H) {
    if (bb != NULL && w != NULL)
        for (int64_t h = 0; h < H; h++) o[h] = j ? o[h] + (r[h] + bb[h]) * wt : (r[h] + bb[h]) * wt;
    else if (bb != NULL)
        for (int64_t h = 0; h < H; h++) o[h] = j ? o[h] + (r[h] + bb[h]) : r[h] + bb[h];
    else if (w != NULL)
        for (int64_t h = 0; h < H; h++) o[h] = j ? o[h] + r[h] * wt : r[h] * wt;
    else
        for (int64_t h = 0; h < H; h++) o[h] = j ? o[h] + r[h] : r[h];
}

// out [T, H]: each token's k expert rows of d [P, H] (sorted; inv: each pair's row), each
// plus its expert's down bias (db [E, H] or NULL) and times its weight (w [T, k], NULL: as
// they are), summed in slot order 0..k-1.
static void st_combine(const float *d, int64_t H, int64_t T, int64_t k, const int64_t *experts,
                       const int64_t *inv, const float *w, const float *db, float *out) {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t p = t * k + j;
            combine_one(out + t * H, d + inv[p] * H, db != NULL ? db + experts[p] * H : NULL, w,
                        w != NULL ? w[p] : 1.0f, j, H);
        }
}

// Threads for a stage of this cost (weight rows x activation rows) over K: one below the
// size where waking a thread costs more than it saves (qmatmul_multi's rule).
static int stage_threads(const plan_t *pl, int64_t K, int nthreads) {
    return pl->cost[pl->n] * K < (1 << 17) ? 1 : nthreads;
}
