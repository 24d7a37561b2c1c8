// The gated delta rule in its chunked form (docs/chunked_scan.md, "Can a chunked form keep the
// numerics contract?"): chunks of C rows aligned to absolute positions 0, C, 2C, ..., and a
// record that carries the state M0 at the last chunk boundary plus the pending rows of the
// current chunk. Per value head, row i at chunk position t:
//
//     G_t = G_{t-1} + lg_i (G_0 = lg_i);  eg = expf(G_t);  e_j = expf(G_t - G_j)
//     w = M0 k_i;  x = M0 q_i                  (each a sum over the key index b from 0 upwards)
//     u_t = beta_i (v_i - eg w);  u_t -= ((beta_i e_j) (k_i . k_j)) u_j      for j = 0 .. t-1
//     acc = eg x;  acc += (e_j (q_i . k_j)) u_j      for j = 0 .. t;   o_i = scale acc
//     t = C-1: M0 <- eg M0;  M0 += (e_j u_j) k_j^T  for j = 0 .. C-1; the pending rows empty
//
// Every product is rounded before it is added (-ffp-contract=off), every dot product is a
// sequential sum over b from 0, every sum over j ascending, and each value lane (a) or
// pending-row lane (j) runs alone, so the vectorized loops never reduce across lanes: a row's
// outputs and every record are the same bits however its sequence's rows are split into
// calls, whatever other sequences share the call, at any thread count and vector width.
// Compiled in deltanet.c's unit, after it (cbuild.UNITS): uses its transpose() and the gates'
// gdn_log_gate (deltanet_step.h).

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gdn_chunk_ops.h"

typedef struct {  // one call's token rows and sizes
    const float *q, *k, *v, *lg, *beta;
    float *o;
    int64_t v_ld, H, S, C;
    float scale;
} gc_io_t;

typedef struct {  // one thread's work buffers
    float *mt;          // [S][S] the boundary state transposed: mt[b S + a] = M0[a][b]
    float *kr, *kt;     // [C][S] the chunk's keys; [S][C] the same transposed (dot lanes)
    float *u, *w, *x;   // [C][S] u_j; M0 k and M0 q of a group's rows (w: e_j u_j at a chunk end)
    float *g, *e;       // [C] G_j; expf(G_t - G_j) of the row running
    float *kk, *qk;     // [C][C] a group row's k . k_j and q . k_j
} gc_work_t;

// Record offsets of head h: M [H][S][S], PK [H][C-1][S], PU [H][C-1][S], PG [H][C-1], cnt.
static inline int64_t gc_pk(int64_t H, int64_t S, int64_t C, int64_t h) {
    return H * S * S + h * (C - 1) * S;
}
static inline int64_t gc_pu(int64_t H, int64_t S, int64_t C, int64_t h) {
    return H * S * S + (H + h) * (C - 1) * S;
}
static inline int64_t gc_pg(int64_t H, int64_t S, int64_t C, int64_t h) {
    return H * S * S + 2 * H * (C - 1) * S + h * (C - 1);
}
static inline int64_t gc_cnt(int64_t H, int64_t S, int64_t C) {
    return H * S * S + H * (C - 1) * (2 * S + 1);
}

// One row at chunk position t (G_t in wk->g): u[t] and the output row orow, from w, x (the
// row's M0 k and M0 q; x becomes the unscaled output) and kk, qk (its dot products with the
// chunk's keys).
static void gc_row(gc_work_t *wk, int64_t t, const float *vi, float bi, const float *w,
                   float *restrict x, const float *kk, const float *qk, float scale, float *orow,
                   int64_t S) {
    float *e = wk->e, *ut = wk->u + t * S;
    const float gt = wk->g[t], eg = expf(gt);
    for (int64_t j = 0; j <= t; j++) e[j] = expf(gt - wk->g[j]);
    for (int64_t a = 0; a < S; a++) ut[a] = bi * (vi[a] - eg * w[a]);
    for (int64_t j = 0; j < t; j++) {
        const float c = (bi * e[j]) * kk[j];
        const float *uj = wk->u + j * S;
        for (int64_t a = 0; a < S; a++) ut[a] = ut[a] - c * uj[a];
    }
    for (int64_t a = 0; a < S; a++) x[a] = eg * x[a];
    for (int64_t j = 0; j <= t; j++) {
        const float c = e[j] * qk[j];
        const float *uj = wk->u + j * S;
        for (int64_t a = 0; a < S; a++) x[a] = x[a] + c * uj[a];
    }
    for (int64_t a = 0; a < S; a++) orow[a] = scale * x[a];
}

// Head h's full state m [S][S] after record rec's pending rows (cnt already checked): M0 times
// (float) exp(G_last), plus each pending row's ((float) exp(G_last - G_j) u_j) k_j^T, added in
// j order; exp in double (libm), each product rounded.
// gdn_chunk.state_of computes the same bits in torch (math.exp, the same order).
static void gc_state_head(const float *rec, float *m, int64_t h, int64_t H, int64_t S, int64_t C) {
    const float *m0 = rec + h * S * S;
    const int64_t cnt = (int64_t)rec[gc_cnt(H, S, C)];
    if (cnt <= 0) {
        memcpy(m, m0, sizeof(float) * (size_t)(S * S));
        return;
    }
    const float *pk = rec + gc_pk(H, S, C, h), *pu = rec + gc_pu(H, S, C, h);
    const float *pg = rec + gc_pg(H, S, C, h);
    const double last = (double)pg[cnt - 1];
    const float eg = (float)exp(last);
    for (int64_t i = 0; i < S * S; i++) m[i] = m0[i] * eg;
    for (int64_t j = 0; j < cnt; j++) {
        const float dec = (float)exp(last - (double)pg[j]);
        for (int64_t a = 0; a < S; a++) {
            const float du = dec * pu[j * S + a];
            float *row = m + a * S;
            for (int64_t b = 0; b < S; b++) row[b] = row[b] + du * pk[j * S + b];
        }
    }
}

// Head h's part of a record: M from the row-major mrow, the p pending rows from wk, zeros past.
static void gc_put(float *rec, const float *mrow, const gc_work_t *wk, int64_t p, int64_t h,
                   int64_t H, int64_t S, int64_t C) {
    float *m = rec + h * S * S;
    if (m != mrow) memcpy(m, mrow, sizeof(float) * (size_t)(S * S));
    const size_t np = sizeof(float) * (size_t)(p * S);
    const size_t nz = sizeof(float) * (size_t)((C - 1 - p) * S);
    memcpy(rec + gc_pk(H, S, C, h), wk->kr, np);
    memset(rec + gc_pk(H, S, C, h) + p * S, 0, nz);
    memcpy(rec + gc_pu(H, S, C, h), wk->u, np);
    memset(rec + gc_pu(H, S, C, h) + p * S, 0, nz);
    memcpy(rec + gc_pg(H, S, C, h), wk->g, sizeof(float) * (size_t)p);
    memset(rec + gc_pg(H, S, C, h) + p, 0, sizeof(float) * (size_t)(C - 1 - p));
}

// Sequence rows lo .. lo + n - 1 of head h from record rin (p pending rows) into rout, the
// record after local row snap_row[e] (e .. e1 - 1) into snap_dst[e] (all but cnt).
static void gc_task(const gc_io_t *io, gc_work_t *wk, const float *rin, float *rout, int64_t p,
                    int64_t h, int64_t lo, int64_t n, const int64_t *snap_row,
                    float *const *snap_dst, int64_t e, int64_t e1) {
    const int64_t H = io->H, S = io->S, C = io->C, ss = S * S;
    const float *mrow = rin + h * ss;  // a row-major copy of the current M0
    float *mout = rout + h * ss;
    int dirty = 0;  // mt holds a newer M0 than mrow
    const int rows = GC_TILES && S % 16 == 0 && n < GC_BLOCK_MIN;  // no transposed state
    if (n > 0 && !rows) transpose(mrow, wk->mt, S);
    memcpy(wk->kr, rin + gc_pk(H, S, C, h), sizeof(float) * (size_t)(p * S));
    memcpy(wk->u, rin + gc_pu(H, S, C, h), sizeof(float) * (size_t)(p * S));
    memcpy(wk->g, rin + gc_pg(H, S, C, h), sizeof(float) * (size_t)p);
    for (int64_t b = 0; b < S; b++)  // the pending keys transposed, zeros past them
        for (int64_t j = 0; j < C; j++) wk->kt[b * C + j] = j < p ? wk->kr[j * S + b] : 0.0f;
    const float *kp[C], *qp[C];
    for (int64_t r = 0; r < n;) {
        const int64_t ng = C - p < n - r ? C - p : n - r;  // rows r .. r + ng - 1: one M0
        for (int64_t i = 0; i < ng; i++) {
            const int64_t th = (lo + r + i) * H + h;
            kp[i] = io->k + th * S, qp[i] = io->q + th * S;
        }
        for (int64_t rr = r + ng; rr < r + ng + C && rr < n; rr++) {  // the next group's rows
            const int64_t th = (lo + rr) * H + h;
            const float *pq = io->q + th * S, *pk = io->k + th * S;
            const float *pv = io->v + (lo + rr) * io->v_ld + h * S;
            for (int64_t b = 0; b < S; b += 16) {
                __builtin_prefetch(pq + b), __builtin_prefetch(pk + b);
                __builtin_prefetch(pv + b);
            }
        }
        for (int64_t i = 0; i < ng; i++) {  // the group's keys join the chunk's
            memcpy(wk->kr + (p + i) * S, kp[i], sizeof(float) * (size_t)S);
            for (int64_t b = 0; b < S; b++) wk->kt[b * C + p + i] = kp[i][b];
        }
        gc_dots(wk->kt, kp, qp, ng, wk->kk, wk->qk, S, C);
        int64_t a0 = 0;
#if GC_TILES
        if (rows) {  // rout's M on the way, then the current M0 there
            gc_mk_tiles(mrow, kp, qp, ng, S, wk->w, wk->x, mrow == mout ? NULL : mout);
            mrow = mout, a0 = S;
        }
#endif
        for (; a0 + GC_LANES <= S; a0 += GC_LANES)
            gc_mk(wk->mt, kp, qp, ng, a0, GC_LANES, S, wk->w, wk->x);
        if (a0 < S) gc_mk(wk->mt, kp, qp, ng, a0, S - a0, S, wk->w, wk->x);
        for (int64_t i = 0; i < ng; i++, r++) {
            const int64_t t = p, th = (lo + r) * H + h;
            const float lgi = io->lg[th];
            wk->g[t] = t == 0 ? lgi : wk->g[t - 1] + lgi;
            gc_row(wk, t, io->v + (lo + r) * io->v_ld + h * S, io->beta[th], wk->w + i * S,
                   wk->x + i * S, wk->kk + i * C, wk->qk + i * C, io->scale, io->o + th * S, S);
            p = t + 1;
            if (p == C) {  // the chunk completes: M0 <- its end state
                float *cu = wk->w;  // rows 0 .. i of w are spent; e = expf(G_t - G_j)
                for (int64_t j = 0; j < C; j++)
                    for (int64_t a = 0; a < S; a++) cu[j * S + a] = wk->e[j] * wk->u[j * S + a];
                const float eg = expf(wk->g[t]);
                if (rows) {
                    gc_end_rows(mrow, mout, cu, wk->kr, eg, S, C), mrow = mout;
                } else {
                    for (a0 = 0; a0 + GC_END_LANES <= S; a0 += GC_END_LANES)
                        gc_end(wk->mt, cu, wk->kr, eg, a0, GC_END_LANES, S, C);
                    if (a0 < S) gc_end(wk->mt, cu, wk->kr, eg, a0, S - a0, S, C);
                    dirty = 1;
                }
                p = 0;
            }
            for (; e < e1 && snap_row[e] == r; e++) {
                if (dirty) transpose(wk->mt, mout, S), mrow = mout, dirty = 0;
                gc_put(snap_dst[e], mrow, wk, p, h, H, S, C);
            }
        }
    }
    if (dirty) transpose(wk->mt, mout, S), mrow = mout;
    gc_put(rout, mrow, wk, p, h, H, S, C);
}

// n_seq sequences; sequence z owns rows lo[z] .. lo[z] + n[z] - 1 of q, k, o [T][H][S]
// (contiguous), v (row stride v_ld, heads contiguous), lg and beta [T][H]. Its record
// (gdn_chunk.py's record_size floats) is read from rec_in[z] and the record after its last row
// written to rec_out[z], which may be rec_in[z] itself (in place: a head's task reads its parts
// of the record before it writes them, cnt is read before the tasks and written after), else
// shares no memory with a record read or written; for e in snap_off[z] .. snap_off[z+1] - 1,
// the record after its local row snap_row[e] (ascending) to snap_dst[e]. Tasks: (sequence, head). Returns 0, -2 out of memory (outputs then undefined),
// -3 sizes that do not fit (a span or snapshot row outside its sequence, v_ld < H S, C
// outside 1 .. 256), -4 a record whose cnt is not an integer in 0 .. C-1 (nothing written).
int ls_gdn_chunk(int64_t n_seq, const int64_t *lo, const int64_t *n, void **rec_in,
                 void **rec_out, const float *q, const float *k, const float *v, int64_t v_ld,
                 const float *lg, const float *beta, float scale, float *o, int64_t H, int64_t S,
                 int64_t C, const int64_t *snap_off, const int64_t *snap_row, void **snap_dst,
                 int nthreads) {
    if (n_seq < 0 || H < 1 || S < 1 || C < 1 || C > GC_MAX_C || v_ld < H * S ||
        (n_seq > 0 && snap_off[0] < 0))
        return -3;
    for (int64_t z = 0; z < n_seq; z++) {  // spans and snapshot rows inside their sequence
        if (lo[z] < 0 || n[z] < 0 || snap_off[z + 1] < snap_off[z]) return -3;
        for (int64_t e = snap_off[z]; e < snap_off[z + 1]; e++)
            if (snap_row[e] < 0 || snap_row[e] >= n[z] ||
                (e > snap_off[z] && snap_row[e] < snap_row[e - 1]))
                return -3;
    }
    const int64_t at = gc_cnt(H, S, C);
    for (int64_t z = 0; z < n_seq; z++) {
        const float c = ((const float *)rec_in[z])[at];
        if (!(c >= 0.0f && c <= (float)(C - 1)) || c != floorf(c)) return -4;
    }
    const gc_io_t io = {q, k, v, lg, beta, o, v_ld, H, S, C, scale};
    const int64_t tasks = n_seq * H;
    if (tasks < 2) nthreads = 1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float *buf = malloc(sizeof(float) * (size_t)(S * S + 5 * C * S + 2 * C + 2 * C * C));
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        gc_work_t wk = {.mt = buf};
        if (buf != NULL) {
            wk.kr = wk.mt + S * S, wk.kt = wk.kr + C * S, wk.u = wk.kt + C * S;
            wk.w = wk.u + C * S, wk.x = wk.w + C * S, wk.g = wk.x + C * S;
            wk.e = wk.g + C, wk.kk = wk.e + C, wk.qk = wk.kk + C * C;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (buf == NULL) continue;
            const int64_t z = task / H, h = task % H;
            const float *rin = rec_in[z];
            const int64_t p = (int64_t)rin[at];
            gc_task(&io, &wk, rin, rec_out[z], p, h, lo[z], n[z], snap_row,
                    (float *const *)snap_dst, snap_off[z], snap_off[z + 1]);
        }
        free(buf);
    }
    for (int64_t z = 0; z < n_seq; z++) {  // cnt: one slot per record, after every head
        const int64_t p = (int64_t)((const float *)rec_in[z])[at];
        ((float *)rec_out[z])[at] = (float)((p + n[z]) % C);
        for (int64_t e = snap_off[z]; e < snap_off[z + 1]; e++)
            ((float *)snap_dst[e])[at] = (float)((p + snap_row[e] + 1) % C);
    }
    return failed ? -2 : 0;
}

// lg = softplus(alpha + dt_b) a (expf(lg) is ls_gdn_gates' g, bit for bit) and beta =
// sigmoid(beta logit), [T][H], of the rows ba [T][ld]: value head h's beta logit at column
// cols[h], its alpha at cols[H + h]. Returns 0, -3 sizes that do not fit.
int ls_gdn_log_gates(const float *ba, int64_t ld, int64_t T, int64_t H, const int64_t *cols,
                     const float *dt_b, const float *a, float *lg, float *beta) {
    if (T < 0 || H < 1 || !ba || !cols || !dt_b || !a || !lg || !beta) return -3;
    for (int64_t h = 0; h < 2 * H; h++)
        if (cols[h] < 0 || cols[h] >= ld) return -3;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const float *row = ba + t * ld;
            float g;
            gdn_gate(row[cols[H + h]], row[cols[h]], dt_b[h], a[h], &g, beta + t * H + h);
            lg[t * H + h] = gdn_log_gate(row[cols[H + h]], dt_b[h], a[h]);
        }
    return 0;
}
