// The tasks of one grouped expert projection (moe.c): blocks of each routed expert's weight
// rows, balanced between the threads by cost, each run on the tile qmatmul_multi would
// choose for that expert's rows (packed Q6_K in pack_q6k.h's layout, packed_q6.h's).

#pragma once

#include "pack_q6k.h"

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
    int64_t next;  // the first task no thread has taken yet (`st_matmul`)
} plan_t;

// The plan's parts and room for its tasks (at most min(E, P) experts with rows); -1 for a
// type without a kernel, -3 for sizes that do not fit. A part of type PACKED | t holds rows
// repacked 8 to a group (packed.h; Q6_K's is pack_q6k.h's layout), read by part_packed's
// tiles and checked at the packed layout's bytes per row (part_row_bytes).
static int plan_init(plan_t *pl, const ls_moe_proj_t *pr, int64_t E, int64_t P, int64_t K,
                     arena_t *ar) {
    int64_t per = 0;
    pl->n = 0, pl->nparts = pr->nparts;
    if (pr->nparts < 1 || pr->nparts > 8) return -3;
    for (int i = 0; i < pr->nparts; i++)
        if ((pr->types[i] & PACKED) && pr->ns[i] % PK_ROWS != 0) return -3;
    const int rc = check_sizes(pr->nparts, pr->types, pr->ns, pr->row_bytes, pr->cols, K, 0,
                               pr->n_out);
    if (rc != 0) return rc;
    for (int i = 0; i < pr->nparts; i++) {
        part_t *p = &pl->parts[i];
        const int rc_i = part_init(p, pr->types[i], pr->ws[i * E], pr->ns[i], pr->row_bytes[i],
                                   pr->cols[i]);
        if (rc_i != 0) return -1;
        per += p->packed ? pr->ns[i] / PK_ROWS : (pr->ns[i] + 3) / 4;
    }
    const int64_t most = (E < P ? E : P) * per;
    pl->tasks = take(ar, sizeof(task_t) * (size_t)most);
    pl->cost = take(ar, sizeof(int64_t) * (size_t)(most + 1));
    return 0;
}

// The tasks of the routed rows of experts e0..e1-1, expert by expert.
static void plan_fill(plan_t *pl, int64_t e0, int64_t e1, const int64_t *off) {
    pl->cost[0] = 0;
    pl->n = pl->next = 0;
    for (int64_t e = e0; e < e1; e++) {
        const int64_t M = off[e + 1] - off[e];
        if (M == 0) continue;
        for (int i = 0; i < pl->nparts; i++) {
            const part_t *p = &pl->parts[i];
            // packed groups a task: qmatmul_multi's rule (pk_task_groups)
            const int64_t pg = p->packed ? pk_task_groups(p->type, M) : 0;
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
        const int64_t ng = left < tk->pg ? left : tk->pg;
        part_packed(p, PK_ROWS * g0, ng, K, a, M, y, ldy);  // packed Q6_K too (packed_q6.h)
        return;
    }
    const int64_t n0 = 4 * tk->blk, n1 = n0 + 4 < p->n ? n0 + 4 : p->n;
    if (M < 4 && n1 - n0 == 4 && !p->kq && (M > 1 || p->n * p->row_bytes <= COLS4_MAX_BYTES))
        part_cols4(p, n0, K, a, M, y, ldy, t);
    else if (M >= ROWS_MIN_M) part_rows(p, n0, n1, K, a, M, y, ldy, t);
    else
        for (int64_t n = n0; n < n1; n++) part_row(p, n, K, a, M, y, ldy, t);
}

// This thread's share of the plan's tasks: y [P, n_out]. Threads take runs of consecutive
// tasks from a shared counter (about 16 runs a thread), so a thread the system preempts
// (the server's own HTTP thread, a client on a 2-core machine) leaves its runs to the
// others instead of holding the whole stage; each task writes its own rows with the same
// tile whoever runs it, so the bits do not depend on which thread took it. The counter is
// reset by plan_fill, which runs before a barrier.
static void st_matmul(plan_t *pl, const ls_moe_proj_t *pr, int64_t E, const int64_t *off,
                      const abuf_t *b, float *y, scratch_t *t) {
    const int64_t nt = omp_get_num_threads(), n = pl->n;
    const int64_t run = nt > 1 && n / (16 * nt) > 1 ? n / (16 * nt) : 1;
    for (;;) {
        const int64_t i0 = __atomic_fetch_add(&pl->next, run, __ATOMIC_RELAXED);
        if (i0 >= n) break;
        for (int64_t i = i0; i < i0 + run && i < n; i++) {
            const task_t *tk = &pl->tasks[i];
            part_t p = pl->parts[tk->part];
            p.w = pr->ws[tk->part * E + tk->e];
            const act_t a = expert_act(b, off, tk->e);
            run_task(&p, tk, b->K, &a, off[tk->e + 1] - off[tk->e], y + off[tk->e] * pr->n_out,
                     pr->n_out, t);
        }
    }
}
