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
// helpers (quantize_block, check_sizes, the part_* tiles).

#include <omp.h>
#include <string.h>

void ls_gated_act(const float *g, const float *u, int64_t T, int64_t F, int64_t ld, int act,
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

// Quantized activations of P sorted rows in the forms the projection's parts read
// (qparts.h's act_t, one block of rows per expert), and d transposed per expert block.
typedef struct {
    int legacy, kq, rows;  // rows: a legacy part in the file's layout (reads dT)
    int64_t K;
    int8_t *q, *k8;
    float *d, *ms, *kd, *dT;
    int16_t *bs, *b16, *b32;
    int64_t *dt_off;  // [E] each expert's block of dT
} abuf_t;

static void abuf_free(abuf_t *b) {
    free(b->q), free(b->d), free(b->ms), free(b->bs), free(b->dT), free(b->dt_off);
    free(b->k8), free(b->kd), free(b->b16), free(b->b32);
}

// Buffers for P rows of K values for `pr`'s parts (off: the expert blocks, NULL for none).
// Returns 0, -1 for a K-quant part with K not whole super-blocks, -2 when out of memory.
static int abuf_init(abuf_t *b, const ls_moe_proj_t *pr, int64_t P, int64_t K, int64_t E,
                     const int64_t *off) {
    memset(b, 0, sizeof(*b));
    b->K = K;
    for (int i = 0; i < pr->nparts; i++) {
        if (is_kquant(pr->types[i] & ~PACKED)) b->kq = 1;
        else b->legacy = 1, b->rows |= !(pr->types[i] & PACKED);
    }
    if (b->kq && K % 256 != 0) return -1;
    const size_t n = (size_t)(P * K + 1), nc = (size_t)(P * (K / 32) + 1);
    int ok = 1;
    if (b->legacy) {
        b->q = malloc(n), b->d = malloc(sizeof(float) * nc);
        b->ms = malloc(sizeof(float) * (2 * nc)), b->bs = malloc(sizeof(int16_t) * nc);
        ok = b->q && b->d && b->ms && b->bs;
    }
    if (ok && b->kq) {
        b->k8 = malloc(n), b->kd = malloc(sizeof(float) * (size_t)(P * (K / 256) + 1));
        b->b16 = malloc(sizeof(int16_t) * (2 * nc)), b->b32 = malloc(sizeof(int16_t) * nc);
        ok = b->k8 && b->kd && b->b16 && b->b32;
    }
    if (ok && b->rows && off != NULL) {
        b->dt_off = malloc(sizeof(int64_t) * (size_t)(E + 1));
        ok = b->dt_off != NULL;
        int64_t total = 0;
        for (int64_t e = 0; ok && e < E; e++) {
            const int64_t m = off[e + 1] - off[e];
            b->dt_off[e] = total;
            if (m >= 4) total += (m + 3) / 4 * (K / 32) * 4;
        }
        if (ok) ok = (b->dT = calloc((size_t)total + 1, sizeof(float))) != NULL;
    }
    if (!ok) abuf_free(b);
    return ok ? 0 : -2;
}

// Row p of b from x [K]: ls_quantize_rows' and ls_quantize_rows_k's numbers for one row.
static void quant_row(const abuf_t *b, int64_t p, const float *x) {
    const int64_t K = b->K;
    if (b->legacy)
        for (int64_t c = 0; c < K / 32; c++) {
            int sums[2];
            const float dd = quantize_block(x + 32 * c, 32, b->q + p * K + 32 * c, sums, 0);
            b->d[p * (K / 32) + c] = dd;
            b->ms[p * (K / 16) + 2 * c] = dd * (float)sums[0];
            b->ms[p * (K / 16) + 2 * c + 1] = dd * (float)sums[1];
            b->bs[p * (K / 32) + c] = (int16_t)(sums[0] + sums[1]);
        }
    if (b->kq)
        for (int64_t c = 0; c < K / 256; c++) {
            int sums[16];
            b->kd[p * (K / 256) + c] =
                quantize_block(x + 256 * c, 256, b->k8 + p * K + 256 * c, sums, 1);
            int16_t *s16 = b->b16 + p * (K / 16) + 16 * c, *s32 = b->b32 + p * (K / 32) + 8 * c;
            for (int j = 0; j < 16; j++) s16[j] = (int16_t)sums[j];
            for (int j = 0; j < 8; j++) s32[j] = (int16_t)(sums[2 * j] + sums[2 * j + 1]);
        }
}

// Row r of src (the same forms and K) copied into row p of dst.
static void copy_row(const abuf_t *dst, int64_t p, const abuf_t *src, int64_t r) {
    const int64_t K = dst->K;
#define LS_CP(f, w) memcpy(dst->f + p * (w), src->f + r * (w), sizeof(*dst->f) * (size_t)(w))
    if (dst->legacy) LS_CP(q, K), LS_CP(d, K / 32), LS_CP(ms, K / 16), LS_CP(bs, K / 32);
    if (dst->kq) LS_CP(k8, K), LS_CP(kd, K / 256), LS_CP(b16, K / 16), LS_CP(b32, K / 32);
#undef LS_CP
}

// Expert e's block of dT (its rows' d transposed per 4, as `transpose_scales`).
static void expert_dT(const abuf_t *b, const int64_t *off, int64_t e) {
    const int64_t m0 = off[e], M = off[e + 1] - m0, nc = b->K / 32;
    if (!b->rows || M < 4) return;
    float *dT = b->dT + b->dt_off[e];
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < nc; c++) dT[(m / 4 * nc + c) * 4 + m % 4] = b->d[(m0 + m) * nc + c];
}

// Expert e's rows of b as the tiles read them (from sorted row s).
static act_t expert_act(const abuf_t *b, const int64_t *off, int64_t e) {
    const int64_t s = off[e], K = b->K;
    const int dt = b->rows && off[e + 1] - s >= 4;
    return (act_t){
        b->q ? b->q + s * K : NULL, b->d ? b->d + s * (K / 32) : NULL,
        b->ms ? b->ms + s * (K / 16) : NULL, b->bs ? b->bs + s * (K / 32) : NULL,
        dt ? b->dT + b->dt_off[e] : NULL, b->k8 ? b->k8 + s * K : NULL,
        b->kd ? b->kd + s * (K / 256) : NULL, b->b16 ? b->b16 + s * (K / 16) : NULL,
        b->b32 ? b->b32 + s * (K / 32) : NULL};
}

// One task: a block of one part's weight rows of expert e against the expert's M rows.
typedef struct {
    int32_t e, part;
    int64_t blk, pg;  // block index; packed groups per block (0: blocks of 4 file rows)
} task_t;

// A projection's tasks in expert order, and the prefix sums of their costs (weight rows x
// (activation rows + 2), the 2 for reading and preparing the rows).
typedef struct {
    part_t parts[8];  // initialised on expert 0's matrices; a task points w at its expert's
    task_t *tasks;
    int64_t *cost, n;
} plan_t;

static int plan_init(plan_t *pl, const ls_moe_proj_t *pr, int64_t E, const int64_t *off,
                     int64_t K) {
    pl->tasks = NULL, pl->cost = NULL, pl->n = 0;
    int64_t per = 0;
    const int rc = check_sizes(pr->nparts, (const int *)pr->types, pr->ns, pr->row_bytes,
                               pr->cols, K, 0, pr->n_out);
    if (rc != 0) return rc;
    for (int i = 0; i < pr->nparts; i++) {
        if (part_init(&pl->parts[i], pr->types[i], pr->ws[i * E], pr->ns[i], pr->row_bytes[i],
                      pr->cols[i]) != 0)
            return -1;
        per += pl->parts[i].packed ? pr->ns[i] / PK_ROWS : (pr->ns[i] + 3) / 4;
    }
    int64_t used = 0;
    for (int64_t e = 0; e < E; e++) used += off[e + 1] > off[e];
    pl->tasks = malloc(sizeof(task_t) * (size_t)(used * per + 1));
    pl->cost = malloc(sizeof(int64_t) * (size_t)(used * per + 2));
    if (pl->tasks == NULL || pl->cost == NULL) return -2;
    pl->cost[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t M = off[e + 1] - off[e];
        if (M == 0) continue;
        for (int i = 0; i < pr->nparts; i++) {
            const part_t *p = &pl->parts[i];
            const int64_t pg = p->packed ? (M >= ROWS_MIN_M ? PK_TASK_GROUPS : 1) : 0;
            const int64_t unit = p->packed ? PK_ROWS * pg : 4;
            for (int64_t r = 0, blk = 0; r < p->n; r += unit, blk++) {
                const int64_t rows = p->n - r < unit ? p->n - r : unit;
                pl->tasks[pl->n] = (task_t){(int32_t)e, i, blk, pg};
                pl->cost[pl->n + 1] = pl->cost[pl->n] + rows * (M + 2);
                pl->n++;
            }
        }
    }
    return 0;
}

static void plan_free(plan_t *pl) { free(pl->tasks), free(pl->cost); }

// The tile of one task, chosen as qmatmul_multi chooses it for M rows.
static void run_task(const part_t *p, const task_t *tk, int64_t K, const act_t *a, int64_t M,
                     float *y, int64_t ldy, scratch_t *t) {
    if (p->packed) {
        const int64_t g0 = tk->pg * tk->blk, left = p->n / PK_ROWS - g0;
        part_packed(p, PK_ROWS * g0, left < tk->pg ? left : tk->pg, K, a, M, y, ldy);
        return;
    }
    const int64_t n0 = 4 * tk->blk, n1 = n0 + 4 < p->n ? n0 + 4 : p->n;
    if (M < 4 && n1 - n0 == 4 && !p->kq && (M > 1 || p->n * p->row_bytes <= COLS4_MAX_BYTES))
        part_cols4(p, n0, K, a, M, y, ldy, t);
    else if (M >= ROWS_MIN_M) part_rows(p, n0, n1, K, a, M, y, ldy, t);
    else
        for (int64_t n = n0; n < n1; n++) part_row(p, n, K, a, M, y, ldy, t);
}

// This thread's share of the plan's tasks (a run of about 1 / nt of the cost): y [P, n_out].
static void st_matmul(const plan_t *pl, const ls_moe_proj_t *pr, int64_t E, const int64_t *off,
                      const abuf_t *b, float *y, scratch_t *t) {
    const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num(), C = pl->cost[pl->n];
    for (int64_t i = 0; i < pl->n; i++) {
        if (C == 0 || pl->cost[i] * nt / C != me) continue;
        const task_t *tk = &pl->tasks[i];
        part_t p = pl->parts[tk->part];
        p.w = pr->ws[tk->part * E + tk->e];
        const act_t a = expert_act(b, off, tk->e);
        run_task(&p, tk, b->K, &a, off[tk->e + 1] - off[tk->e], y + off[tk->e] * pr->n_out,
                 pr->n_out, t);
    }
}

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

// out [T, H]: each token's k expert rows of d [P, H] (sorted; inv: each pair's row), each
// plus its expert's down bias (db [E, H] or NULL) and times its weight (w [T, k], NULL: as
// they are), summed in slot order 0..k-1.
static void st_combine(const float *d, int64_t H, int64_t T, int64_t k, const int64_t *experts,
                       const int64_t *inv, const float *w, const float *db, float *out) {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * H;
        for (int64_t j = 0; j < k; j++) {
            const int64_t p = t * k + j;
            const float *r = d + inv[p] * H, *bb = db != NULL ? db + experts[p] * H : NULL;
            const float wt = w != NULL ? w[p] : 1.0f;
            if (bb != NULL && w != NULL)
                for (int64_t h = 0; h < H; h++) o[h] = j ? o[h] + (r[h] + bb[h]) * wt : (r[h] + bb[h]) * wt;
            else if (bb != NULL)
                for (int64_t h = 0; h < H; h++) o[h] = j ? o[h] + (r[h] + bb[h]) : r[h] + bb[h];
            else if (w != NULL)
                for (int64_t h = 0; h < H; h++) o[h] = j ? o[h] + r[h] * wt : r[h] * wt;
            else
                for (int64_t h = 0; h < H; h++) o[h] = j ? o[h] + r[h] : r[h];
        }
    }
}

// Threads for a stage of this cost (weight rows x activation rows) over K: one below the
// size where waking a thread costs more than it saves (qmatmul_multi's rule).
static int stage_threads(const plan_t *pl, int64_t K, int nthreads) {
    return pl->cost[pl->n] * K < (1 << 17) ? 1 : nthreads;
}

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
    int rc = plan_init(&pl, pr, E, off, K);
    if (rc == 0) rc = abuf_init(&b, pr, P, K, E, off);
    if (rc == 0 && src != NULL && scale == NULL && (rc = abuf_init(&tmp, pr, R, K, E, NULL)) != 0)
        abuf_free(&b);
    if (rc != 0) {
        plan_free(&pl);
        return rc;
    }
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
    abuf_free(&b), abuf_free(&tmp), plan_free(&pl);
    return 0;
}

// a [P, F] = act(gate + gate bias) * (up + up bias) of the sorted rows of gu [P, 2F] (the
// biases added to gu in place; gb, ub [E, F] or NULL). act: rowops.c's codes.
void ls_moe_act(float *gu, int64_t E, const int64_t *off, int64_t F, const float *gb,
                const float *ub, int act, float *a, int nthreads) {
    const int64_t P = off[E];
    if (P * F < (1 << 15)) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    st_act(gu, P, F, off, gb, ub, act, a, NULL);
}

// out [T, H] = the weighted sum of each token's expert rows (`st_combine`).
void ls_moe_combine(const float *d, int64_t H, int64_t T, int64_t k, const int64_t *experts,
                    const int64_t *inv, const float *w, const float *db, float *out,
                    int nthreads) {
    if (T * k * H < (1 << 15)) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    st_combine(d, H, T, k, experts, inv, w, db, out);
}

// The routed experts of T tokens in one call: out [T, H] = sum over slots j of w[t, j] *
// (down_e(act(gate_up_e(x_t) + biases)) + down bias), e = experts[t, j] ([T, k] int64, each
// in 0..E-1); with `before` (llama4) each expert's input is x_t * w[t, j] and its output is
// not weighted. The same stages, functions and orders as ls_moe_route, ls_moe_matmul,
// ls_moe_act, ls_moe_matmul and ls_moe_combine called in turn, so the same bits. Returns
// 0 or ls_moe_matmul's codes.
int ls_moe_ffn(const ls_moe_proj_t *gate_up, const ls_moe_proj_t *down, int64_t E, int64_t H,
               int64_t F, const float *x, int64_t T, int64_t k, const int64_t *experts,
               const float *w, int before, const float *gb, const float *ub, const float *db,
               int act, float *out, int nthreads) {
    const int64_t P = T * k;
    if (H % 32 != 0 || F % 32 != 0 || gate_up->n_out != 2 * F || down->n_out != H) return -3;
    if (P == 0) return 0;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(E + 1 + 3 * P));
    float *scale = before ? malloc(sizeof(float) * (size_t)P) : NULL;
    float *gu = malloc(sizeof(float) * (size_t)(P * (3 * F + H)));
    if (off == NULL || gu == NULL || (before && scale == NULL)) {
        free(off), free(scale), free(gu);
        return -2;
    }
    int64_t *pair = off + E + 1, *inv = pair + P, *src = inv + P;
    float *a = gu + P * 2 * F, *d = a + P * F;
    int rc = ls_moe_route(T, k, E, experts, off, pair, inv);
    for (int64_t s = 0; rc == 0 && s < P; s++) {
        src[s] = pair[s] / k;
        if (before) scale[s] = w[pair[s]];
    }
    plan_t p1, p2;
    abuf_t bx, tmp, ba;
    memset(&tmp, 0, sizeof(tmp));
    p1.tasks = p2.tasks = NULL, p1.cost = p2.cost = NULL;
    if (rc == 0) rc = plan_init(&p1, gate_up, E, off, H);
    if (rc == 0) rc = plan_init(&p2, down, E, off, F);
    int bufs = 0;
    if (rc == 0 && (rc = abuf_init(&bx, gate_up, P, H, E, off)) == 0) bufs |= 1;
    if (rc == 0 && !before && (rc = abuf_init(&tmp, gate_up, T, H, E, NULL)) == 0) bufs |= 2;
    if (rc == 0 && (rc = abuf_init(&ba, down, P, F, E, off)) == 0) bufs |= 4;
    if (rc == 0) {
        int nt = stage_threads(&p1, H, nthreads);
        if (stage_threads(&p2, F, nthreads) > nt) nt = nthreads;
#pragma omp parallel num_threads(nt)
        {
            scratch_t t;
            scratch_init(&t, H > F ? H : F);
            float *row = before ? malloc(sizeof(float) * (size_t)H) : NULL;
            st_quant(&bx, &tmp, x, H, T, P, src, scale, row, E, off);
            st_matmul(&p1, gate_up, E, off, &bx, gu, &t);
#pragma omp barrier
            st_act(gu, P, F, off, gb, ub, act, a, &ba);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t e = 0; e < E; e++) expert_dT(&ba, off, e);
            st_matmul(&p2, down, E, off, &ba, d, &t);
#pragma omp barrier
            st_combine(d, H, T, k, experts, inv, before ? NULL : w, db, out);
            free(row);
            scratch_free(&t);
        }
    }
    if (bufs & 1) abuf_free(&bx);
    if (bufs & 2) abuf_free(&tmp);
    if (bufs & 4) abuf_free(&ba);
    plan_free(&p1), plan_free(&p2);
    free(off), free(scale), free(gu);
    return rc;
}
