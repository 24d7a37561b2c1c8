// Grouped expert matmuls of a mixture-of-experts layer: for a step's tokens and their top-k
// routed experts, one call computes every expert's gate|up rows, the gated activation and
// the down rows, and the weighted combine (`ls_moe_ffn`), or each of those stages alone
// (`ls_moe_matmul`, `ls_moe_act`, `ls_moe_combine`: the path with LoRA deltas between them).
//
// The (token, slot) pairs are sorted by expert (`ls_moe_route`, a stable counting sort), so
// each expert's input rows are one contiguous block of activations, which the tiles of
// qparts.h multiply by that expert's weight rows exactly as `ls_qmatmul_multi_f32` would:
// the same activation quantization per row, the same dot products per output, so a row's
// numbers do not depend on which other rows an expert has. One parallel region per call;
// threads take runs of (expert, weight-row block) tasks of about equal cost.
//
// The combine sums each token's k expert outputs in its top-k slot order (llama.cpp's
// build_moe_ffn order), never in an order that depends on the batch.
//
// Compiled in one unit after qmatmul.c and quantize.c (cbuild.UNITS): it calls their static
// helpers (quantize_block, check_sizes, the part_* tiles). Its headers: moe_buf.h (the
// workspace and the quantized rows), moe_plan.h (the tasks), moe_stages.h (the stages of a
// parallel region), moe_pend.h (the sums of a grouped call's rows as their groups end),
// pack_q6k.h (Q6_K experts repacked 8 rows to a group).

#include <omp.h>
#include <string.h>

int ls_gated_act(const float *g, const float *u, int64_t T, int64_t F, int64_t ld, int act,
                 float *out, int nthreads);

// One expert projection: up to 8 stacked matrices side by side on the output columns
// (gate|up); part i of expert e at ws[i * E + e], every expert of a part of one type and size.
typedef struct {
    int32_t nparts;
    int32_t types[8];
    const uint8_t *const *ws;
    int64_t ns[8], row_bytes[8], cols[8];
    int64_t n_out;  // the output row width
} ls_moe_proj_t;

// Pairs p = t * k + j (token t, top-k slot j) sorted by expert, ties in pair order:
// off [E + 1] each expert's first sorted position, pair [P] the pair at each sorted position,
// inv [P] each pair's sorted position. Returns 0, or -3 for an expert id outside 0..E-1.
int ls_moe_route(int64_t T, int64_t k, int64_t E, const int64_t *experts, int64_t *off,
                 int64_t *pair, int64_t *inv) {
    if (T < 0 || k < 0 || E < 1) return -3;
    const int64_t P = T * k;
    for (int64_t e = 0; e <= E; e++) off[e] = 0;
    for (int64_t p = 0; p < P; p++) {
        if (experts[p] < 0 || experts[p] >= E) return -3;
        off[experts[p] + 1]++;
    }
    for (int64_t e = 0; e < E; e++) off[e + 1] += off[e];
    int64_t *next = malloc(sizeof(int64_t) * (size_t)(E + 1));
    if (next == NULL) return -2;
    memcpy(next, off, sizeof(int64_t) * (size_t)(E + 1));
    for (int64_t p = 0; p < P; p++) {
        const int64_t s = next[experts[p]]++;
        pair[s] = p;
        inv[p] = s;
    }
    free(next);
    return 0;
}

#include "moe_buf.h"
#include "moe_plan.h"
#include "moe_stages.h"
#include "moe_pend.h"

// y [P, pr->n_out] = sorted rows times their experts' matrices: sorted row s is input row
// src[s] of x [R, K] (row stride ldx; src NULL: row s, R = P) times scale[s] (NULL: none),
// quantized per row; off [E + 1] each expert's sorted rows (`ls_moe_route`). Returns 0, -1
// for a type without a kernel, -2 when out of memory, -3 for sizes that do not fit.
int ls_moe_matmul(const ls_moe_proj_t *pr, int64_t E, const int64_t *off, int64_t K,
                  const float *x, int64_t ldx, int64_t R, const int64_t *src, const float *scale,
                  float *y, int nthreads) {
    const int64_t P = off[E];
    if (ldx < K || K % 32 != 0 || P < 0 || (src == NULL && R != P)) return -3;
    for (int64_t s = 0; src != NULL && s < P; s++)
        if (src[s] < 0 || src[s] >= R) return -3;
    if (P == 0) return 0;
    plan_t pl;
    abuf_t b, tmp;
    memset(&tmp, 0, sizeof(tmp));
    arena_t ar = {NULL, 0};
    wspace_t ws = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {  // the sizes, then the buffers
        if (pass == 1 && (ws = ws_take(ar.used)).base == NULL) return -2;
        ar = (arena_t){ws.base, 0};
        const int rc = plan_init(&pl, pr, E, P, K, &ar);
        if (rc != 0) return rc;  // only the first pass can fail
        abuf_init(&b, pr, P, K, E, 1, &ar);
        if (src != NULL && scale == NULL) abuf_init(&tmp, pr, R, K, E, 0, &ar);
    }
    plan_fill(&pl, 0, E, off);
    abuf_blocks(&b, 0, E, off);
#pragma omp parallel num_threads(stage_threads(&pl, K, nthreads))
    {
        scratch_t t;
        scratch_init(&t, K);
        float *row = scale != NULL ? malloc(sizeof(float) * (size_t)K) : NULL;
        st_quant(&b, &tmp, x, ldx, R, P, src, scale, row, E, off);
        st_matmul(&pl, pr, E, off, &b, y, &t);
        free(row);
        scratch_free(&t);
    }
    ws_give(ws);
    return 0;
}

// a [P, F] = act(gate + gate bias) * (up + up bias) of the sorted rows of gu [P, 2F] (the
// biases added to gu in place; gb, ub [E, F] or NULL). act: rowops.c's codes.
// Returns 0, or -3 for sizes that do not fit (offsets not ascending from 0).
int ls_moe_act(float *gu, int64_t E, const int64_t *off, int64_t F, const float *gb,
               const float *ub, int act, float *a, int nthreads) {
    if (E < 1 || F < 1 || !off || off[0] != 0) return -3;
    for (int64_t e = 0; e < E; e++)
        if (off[e + 1] < off[e]) return -3;
    const int64_t P = off[E];
    if (P > 0 && (!gu || !a)) return -3;
    if (P * F < (1 << 15)) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    st_act(gu, P, F, off, gb, ub, act, a, NULL);
    return 0;
}

// out [T, H] = the weighted sum of each token's expert rows (`st_combine`). Returns 0, or -3
// for sizes that do not fit (a sorted position outside the T k rows, a negative expert).
int ls_moe_combine(const float *d, int64_t H, int64_t T, int64_t k, const int64_t *experts,
                   const int64_t *inv, const float *w, const float *db, float *out,
                   int nthreads) {
    if (H < 1 || T < 0 || k < 0 || (T * k > 0 && (!d || !experts || !inv || !out))) return -3;
    for (int64_t p = 0; p < T * k; p++)
        if (inv[p] < 0 || inv[p] >= T * k || experts[p] < 0) return -3;
    if (T * k * H < (1 << 15)) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    st_combine(d, H, T, k, experts, inv, w, db, out);
    return 0;
}

// The expert groups of a routed call: runs of consecutive experts whose rows fit `cap`
// (an expert with more rows alone); gstart [E + 1] their first experts, ending with E.
// Returns the number of groups; *rows the most rows of one group.
static int64_t expert_groups(int64_t E, const int64_t *off, int64_t cap, int64_t *gstart,
                             int64_t *rows) {
    int64_t n = 0, most = 0;
    for (int64_t e = 0; e < E; e++) {
        if (n == 0 || off[e + 1] - off[gstart[n - 1]] > cap) gstart[n++] = e;
        const int64_t r = off[e + 1] - off[gstart[n - 1]];
        most = r > most ? r : most;
    }
    gstart[n] = E;
    *rows = most;
    return n;
}

// Bytes of one group's gate|up rows: experts are run in groups whose rows' gate|up outputs
// fit this, so that a prompt's [P, 2F], [P, F] and [P, H] rows are never held at once (for
// 512 tokens of gpt-oss-20b shapes the workspace went from 109 MB to ~20 MB).
#define GROUP_BYTES ((int64_t)4 << 20)

// The routed experts of T tokens in one call: out [T, H] = sum over slots j of w[t, j] *
// (down_e(act(gate_up_e(x_t) + biases)) + down bias), e = experts[t, j] ([T, k] int64, each
// in 0..E-1); with `before` (llama4) each expert's input is x_t * w[t, j] and its output is
// not weighted. The same stages, functions and orders as ls_moe_route, ls_moe_matmul,
// ls_moe_act, ls_moe_matmul and ls_moe_combine called in turn, so the same bits: each
// group of experts (`expert_groups`) runs gate|up, the activation and down on its own rows,
// and a row's numbers depend on its expert's rows only through the tile chosen for their
// count, the same in either path; each token's sum adds its slots in order as their groups
// end (`moe_pend.h`), the combine's operations. Returns 0 or ls_moe_matmul's codes.
int ls_moe_ffn(const ls_moe_proj_t *gate_up, const ls_moe_proj_t *down, int64_t E, int64_t H,
               int64_t F, const float *x, int64_t T, int64_t k, const int64_t *experts,
               const float *w, int before, const float *gb, const float *ub, const float *db,
               int act, float *out, int nthreads) {
    const int64_t P = T * k;
    if (T < 0 || k < 0 || E < 1 || H < 1 || F < 1 || H % 32 != 0 || F % 32 != 0 ||
        gate_up->n_out != 2 * F || down->n_out != H)
        return -3;
    if (P == 0) return 0;
    // the routing, the groups and the pending rows' plan (small: 9 P + 2 T + 3 (E + 1) values)
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(9 * P + 2 * T + 3 * (E + 1)));
    if (idx == NULL) return -2;
    int64_t *off = idx, *pair = off + E + 1, *inv = pair + P, *src = inv + P;
    int64_t *goff = src + P, *gstart = goff + E + 1, *grp = gstart + E + 1, *pslot = grp + P;
    int64_t *nx = pslot + P, *freel = nx + T;  // freel [2 P], then scale [P] floats
    float *scale = (float *)(freel + 2 * P);
    int rc = ls_moe_route(T, k, E, experts, off, pair, inv);
    if (rc != 0) {
        free(idx);
        return rc;
    }
    for (int64_t s = 0; s < P; s++) {
        src[s] = pair[s] / k;
        if (before) scale[s] = w[pair[s]];
    }
    int64_t G = 0;
    const int64_t ng = expert_groups(E, off, GROUP_BYTES / (8 * F), gstart, &G);
    const int64_t npool = pend_plan(T, k, ng, gstart, off, pair, grp, pslot, nx, freel);
    for (int64_t t = 0; t < T; t++) nx[t] = 0;
    float *gu = NULL, *dg = NULL, *pool = NULL;
    plan_t p1, p2;
    abuf_t bx, tmp, ba;
    memset(&tmp, 0, sizeof(tmp));
    arena_t ar = {NULL, 0};
    wspace_t ws = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {  // the sizes, then the buffers
        if (pass == 1 && (ws = ws_take(ar.used)).base == NULL) rc = -2;
        ar = (arena_t){ws.base, 0};
        if (rc == 0) rc = plan_init(&p1, gate_up, E, G, H, &ar);
        if (rc == 0) rc = plan_init(&p2, down, E, G, F, &ar);
        if (rc != 0) {  // only the first pass can fail (or the mapping)
            free(idx);
            return rc;
        }
        gu = take(&ar, sizeof(float) * (size_t)(G * 2 * F));
        dg = take(&ar, sizeof(float) * (size_t)(G * H));
        pool = take(&ar, sizeof(float) * (size_t)(npool * H));
        abuf_init(&bx, gate_up, G, H, E, 1, &ar);
        if (!before) abuf_init(&tmp, gate_up, T, H, E, 0, &ar);
        abuf_init(&ba, down, G, F, E, 1, &ar);
    }
    // threads as the stages' costs (weight rows x (rows + 2) over K) ask, qmatmul_multi's rule
    int64_t used = 0;
    for (int64_t e = 0; e < E; e++) used += off[e + 1] > off[e];
    const int64_t c1 = 2 * F * (P + 2 * used) * H, c2 = H * (P + 2 * used) * F;
    const int nt = c1 < (1 << 17) && c2 < (1 << 17) ? 1 : nthreads;
#pragma omp parallel num_threads(nt)
    {
        scratch_t t;
        scratch_init(&t, H > F ? H : F);
        float *row = malloc(sizeof(float) * (size_t)(H > F ? H : F));
        if (!before) {  // each token's row quantized once, copied to its k pairs
#pragma omp for schedule(static)
            for (int64_t r = 0; r < T; r++) quant_row(&tmp, r, x + r * H);
        }
        for (int64_t g = 0; g < ng; g++) {
            const int64_t e0 = gstart[g], e1 = gstart[g + 1], s0 = off[e0];
#pragma omp single
            {
                for (int64_t e = e0; e <= e1; e++) goff[e] = off[e] - s0;
                plan_fill(&p1, e0, e1, goff), plan_fill(&p2, e0, e1, goff);
                abuf_blocks(&bx, e0, e1, goff), abuf_blocks(&ba, e0, e1, goff);
            }
            st_quant_group(&bx, &tmp, x, H, src, before ? scale : NULL, row, s0, e0, e1, goff);
            st_matmul(&p1, gate_up, E, goff, &bx, gu, &t);
#pragma omp barrier
            st_act_group(gu, F, goff, e0, e1, gb, ub, act, row, &ba);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t e = e0; e < e1; e++) expert_dT(&ba, goff, e);
            st_matmul(&p2, down, E, goff, &ba, dg, &t);
#pragma omp barrier
            st_pend_group(g, dg, s0, goff[e1], pool, H, T, k, experts, inv, pair, grp, pslot, nx,
                          before ? NULL : w, db, out);
        }
        free(row);
        scratch_free(&t);
    }
    ws_give(ws);
    free(idx);
    return 0;
}
