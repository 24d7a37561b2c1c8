// The down rows of a grouped expert call (moe.c's ls_moe_ffn) summed as their groups end:
// a token's slot j is added once its slots 0..j-1 are, so its sum has llama.cpp's slot
// order whatever order the groups run its experts in; a row whose earlier slots are still
// to come waits in a pool row. The pool's rows are planned before the call (`pend_plan`),
// so its size is known (about a quarter of the [P, H] rows for top-4, two fifths for
// top-8, against all of them kept to a combine at the end) and every row's place is fixed.

#pragma once

// Pair p's group (grp [P]) and pool row (pslot [P]: -1 when it is summed in its own group),
// by running the groups in order: a group's rows end, each of its tokens sums the slots it
// can, its rows still waiting take pool rows (the ones freed by an earlier group, else new).
// A row freed in a group is reused from the next group on, so no group writes a pool row
// that it also reads. next [T], freel [2 P]: scratch. Returns the pool's rows.
static int64_t pend_plan(int64_t T, int64_t k, int64_t ng, const int64_t *gstart,
                         const int64_t *off, const int64_t *pair, int64_t *grp, int64_t *pslot,
                         int64_t *next, int64_t *freel) {
    const int64_t P = T * k;
    int64_t *rel = freel + P, nfree = 0, rows = 0;
    for (int64_t g = 0; g < ng; g++)
        for (int64_t s = off[gstart[g]]; s < off[gstart[g + 1]]; s++) grp[pair[s]] = g;
    for (int64_t t = 0; t < T; t++) next[t] = 0;
    for (int64_t g = 0; g < ng; g++) {
        const int64_t s0 = off[gstart[g]], s1 = off[gstart[g + 1]];
        int64_t nrel = 0;
        for (int64_t s = s0; s < s1; s++) {
            const int64_t t = pair[s] / k;
            while (next[t] < k && grp[t * k + next[t]] <= g) {
                const int64_t q = t * k + next[t]++;
                if (grp[q] < g) rel[nrel++] = pslot[q];
            }
        }
        for (int64_t s = s0; s < s1; s++) {
            const int64_t p = pair[s];
            pslot[p] = p % k >= next[p / k] ? (nfree > 0 ? freel[--nfree] : rows++) : -1;
        }
        for (int64_t i = 0; i < nrel; i++) freel[nfree++] = rel[i];
    }
    return rows;
}

// Group g's part of the sums (its down rows dg [Pg, H] from sorted row s0): each token adds
// the slots it can now (nx [T]: its next slot), from dg or the pool [rows, H]; then the
// group's waiting rows go to their pool rows.
static void st_pend_group(int64_t g, const float *dg, int64_t s0, int64_t Pg, float *pool,
                          int64_t H, int64_t T, int64_t k, const int64_t *experts,
                          const int64_t *inv, const int64_t *pair, const int64_t *grp,
                          const int64_t *pslot, int64_t *nx, const float *w, const float *db,
                          float *out) {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; t++)
        while (nx[t] < k && grp[t * k + nx[t]] <= g) {
            const int64_t j = nx[t]++, q = t * k + j;
            const float *r = grp[q] == g ? dg + (inv[q] - s0) * H : pool + pslot[q] * H;
            combine_one(out + t * H, r, db != NULL ? db + experts[q] * H : NULL, w,
                        w != NULL ? w[q] : 1.0f, j, H);
        }
#pragma omp for schedule(static)
    for (int64_t s = 0; s < Pg; s++) {
        const int64_t p = pair[s0 + s];
        if (pslot[p] >= 0) memcpy(pool + pslot[p] * H, dg + s * H, sizeof(float) * (size_t)H);
    }
}
