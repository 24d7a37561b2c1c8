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

// One call's buffers, carved from one workspace: a counting pass (base NULL: sizes only,
// nothing written) then the same takes on the real memory.
typedef struct {
    char *base;
    size_t used;
} arena_t;

static void *take(arena_t *ar, size_t n) {
    void *p = ar->base != NULL ? ar->base + ar->used : NULL;
    ar->used += (n + 63) & ~(size_t)63;
    return p;
}

// Workspaces up to this size stay with the calling thread between calls: a prompt's
// buffers (~90 MB for 512 tokens of Qwen3-30B-A3B shapes) faulted in and zeroed anew by
// the kernel every call cost ~20% of its MoE layer's CPU time (measured, 1 thread).
#define WS_KEEP_MAX ((size_t)256 << 20)
static _Thread_local char *ws_base;
static _Thread_local size_t ws_cap;

// n bytes for this call: the thread's kept workspace (grown when needed), or, above
// WS_KEEP_MAX, memory of its own (*owned set: the caller frees it). NULL when out of memory.
static char *workspace(size_t n, int *owned) {
    *owned = 0;
    n = (n + 63) & ~(size_t)63;
    if (n == 0) n = 64;
    if (n <= ws_cap) return ws_base;
    if (n > WS_KEEP_MAX) {
        *owned = 1;
        return aligned_alloc(64, n);
    }
    free(ws_base);
    ws_base = aligned_alloc(64, n);
    ws_cap = ws_base != NULL ? n : 0;
    return ws_base;
}

// Buffers for P rows of K values in the forms `pr`'s parts read; with `blocks`, room for
// d transposed per expert block of E experts (`abuf_blocks` places them once routed).
static void abuf_init(abuf_t *b, const ls_moe_proj_t *pr, int64_t P, int64_t K, int64_t E,
                      int blocks, arena_t *ar) {
    memset(b, 0, sizeof(*b));
    b->K = K;
    for (int i = 0; i < pr->nparts; i++) {
        if (is_kquant(pr->types[i] & ~PACKED)) b->kq = 1;
        else b->legacy = 1, b->rows |= !(pr->types[i] & PACKED);
    }
    const size_t n = (size_t)(P * K), n32 = (size_t)(P * (K / 32)), n16 = (size_t)(P * (K / 16));
    if (b->legacy) {
        b->q = take(ar, n), b->d = take(ar, sizeof(float) * n32);
        b->ms = take(ar, sizeof(float) * n16), b->bs = take(ar, sizeof(int16_t) * n32);
    }
    if (b->kq) {
        b->k8 = take(ar, n), b->kd = take(ar, sizeof(float) * (size_t)(P * (K / 256)));
        b->b16 = take(ar, sizeof(int16_t) * n16), b->b32 = take(ar, sizeof(int16_t) * n32);
    }
    if (b->rows && blocks) {  // at most P + 3 per expert with rows padded to whole 4s
        const int64_t padded = P + 3 * (E < P ? E : P);
        b->dt_off = take(ar, sizeof(int64_t) * (size_t)(E + 1));
        b->dT = take(ar, sizeof(float) * (size_t)(padded * (K / 32)));
    }
}

// Each expert's block of dT (the padding rows 0), once the rows are routed.
static void abuf_blocks(abuf_t *b, int64_t E, const int64_t *off) {
    if (b->dt_off == NULL) return;
    int64_t total = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t m = off[e + 1] - off[e];
        b->dt_off[e] = total;
        if (m >= 4) total += (m + 3) / 4 * (b->K / 32) * 4;
    }
    memset(b->dT, 0, sizeof(float) * (size_t)total);
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
    int nparts;
    task_t *tasks;
    int64_t *cost, n;
} plan_t;

// The plan's parts and room for its tasks (at most min(E, P) experts with rows); -1 for a
// type without a kernel, -3 for sizes that do not fit.
static int plan_init(plan_t *pl, const ls_moe_proj_t *pr, int64_t E, int64_t P, int64_t K,
                     arena_t *ar) {
    int64_t per = 0;
    pl->n = 0, pl->nparts = pr->nparts;
    const int rc = check_sizes(pr->nparts, (const int *)pr->types, pr->ns, pr->row_bytes,
                               pr->cols, K, 0, pr->n_out);
    if (rc != 0) return rc;
    for (int i = 0; i < pr->nparts; i++) {
        if (part_init(&pl->parts[i], pr->types[i], pr->ws[i * E], pr->ns[i], pr->row_bytes[i],
                      pr->cols[i]) != 0)
            return -1;
        per += pl->parts[i].packed ? pr->ns[i] / PK_ROWS : (pr->ns[i] + 3) / 4;
    }
    const int64_t most = (E < P ? E : P) * per;
    pl->tasks = take(ar, sizeof(task_t) * (size_t)most);
    pl->cost = take(ar, sizeof(int64_t) * (size_t)(most + 1));
    return 0;
}

// The tasks of the routed rows, expert by expert.
static void plan_fill(plan_t *pl, int64_t E, const int64_t *off) {
    pl->cost[0] = 0;
    pl->n = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t M = off[e + 1] - off[e];
        if (M == 0) continue;
        for (int i = 0; i < pl->nparts; i++) {
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
}

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
    arena_t ar = {NULL, 0};
    char *mem = NULL;
    int owned = 0;
    for (int pass = 0; pass < 2; pass++) {  // the sizes, then the buffers
        if (pass == 1 && (mem = workspace(ar.used, &owned)) == NULL) return -2;
        ar = (arena_t){mem, 0};
        const int rc = plan_init(&pl, pr, E, P, K, &ar);
        if (rc != 0) return rc;  // only the first pass can fail
        abuf_init(&b, pr, P, K, E, 1, &ar);
        if (src != NULL && scale == NULL) abuf_init(&tmp, pr, R, K, E, 0, &ar);
    }
    plan_fill(&pl, E, off);
    abuf_blocks(&b, E, off);
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
    if (owned) free(mem);
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
    int64_t *off = NULL, *pair = NULL, *inv = NULL, *src = NULL;
    float *scale = NULL, *gu = NULL, *a = NULL, *d = NULL;
    plan_t p1, p2;
    abuf_t bx, tmp, ba;
    memset(&tmp, 0, sizeof(tmp));
    arena_t ar = {NULL, 0};
    char *mem = NULL;
    int owned = 0;
    for (int pass = 0; pass < 2; pass++) {  // the sizes, then the buffers
        if (pass == 1 && (mem = workspace(ar.used, &owned)) == NULL) return -2;
        ar = (arena_t){mem, 0};
        int rc = plan_init(&p1, gate_up, E, P, H, &ar);
        if (rc == 0) rc = plan_init(&p2, down, E, P, F, &ar);
        if (rc != 0) return rc;  // only the first pass can fail
        off = take(&ar, sizeof(int64_t) * (size_t)(E + 1));
        pair = take(&ar, sizeof(int64_t) * (size_t)P), inv = take(&ar, sizeof(int64_t) * (size_t)P);
        src = take(&ar, sizeof(int64_t) * (size_t)P);
        if (before) scale = take(&ar, sizeof(float) * (size_t)P);
        gu = take(&ar, sizeof(float) * (size_t)(P * 2 * F));
        a = take(&ar, sizeof(float) * (size_t)(P * F)), d = take(&ar, sizeof(float) * (size_t)(P * H));
        abuf_init(&bx, gate_up, P, H, E, 1, &ar);
        if (!before) abuf_init(&tmp, gate_up, T, H, E, 0, &ar);
        abuf_init(&ba, down, P, F, E, 1, &ar);
    }
    const int rc = ls_moe_route(T, k, E, experts, off, pair, inv);
    if (rc != 0) {
        if (owned) free(mem);
        return rc;
    }
    for (int64_t s = 0; s < P; s++) {
        src[s] = pair[s] / k;
        if (before) scale[s] = w[pair[s]];
    }
    plan_fill(&p1, E, off), plan_fill(&p2, E, off);
    abuf_blocks(&bx, E, off), abuf_blocks(&ba, E, off);
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
    if (owned) free(mem);
    return 0;
}
