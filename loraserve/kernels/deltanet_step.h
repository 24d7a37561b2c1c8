// A decode step of a gated delta-net mixer in one call (issue 28: the mixer's ~20 torch ops and
// kernel calls between its two projections): T rows, each the one new row of its own
// sequence, from the in-projection's output to the out-projection's input. Included at the
// end of deltanet.c (its token functions); also the fused layers' delta-net mixer (layers.c).
//
// Same bits as recurrent/deltanet.py's general path, which runs these very pieces one call at
// a time: ls_conv_step (conv, SiLU), ls_rms_norm of q's and k's heads times 1/sqrt(S), the
// gates (ls_gdn_gates, the one formula of every path), the recurrence (token_tiles or
// token_t, as ls_gdn_recur runs a token), ls_rms_norm of each head's output and
// ls_gated_act (SiLU(z) times it). Each sequence's new state goes into its new record
// (conv rows, then M), read from its old one (never written).

#include <math.h>

#include "layers.h"

// log g = softplus(alpha + dt_b) a of one value, with libm's expf and log1pf (softplus past
// 20: x, as torch and ggml); gdn_chunk.c's log gates are these bits, g is their expf.
static inline float gdn_log_gate(float alpha, float dt_b, float a) {
    const float x = alpha + dt_b;
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    return sp * a;
}

// g = exp(softplus(alpha + dt_b) a) and beta = sigmoid(beta logit) of one value, with libm's
// expf and log1pf: the same bits in any layout.
static inline void gdn_gate(float alpha, float blog, float dt_b, float a, float *g, float *b) {
    *g = expf(gdn_log_gate(alpha, dt_b, a));
    *b = 1.0f / (1.0f + expf(-blog));
}

// g, beta [T, H] of the rows ba [T, ld]: value head h's beta logit at column cols[h], its
// alpha at cols[H + h]. Every delta-net path (prompts, decode steps, the fused layers) computes
// its gates here. Returns 0, -3 sizes that do not fit.
int ls_gdn_gates(const float *ba, int64_t ld, int64_t T, int64_t H, const int64_t *cols,
                 const float *dt_b, const float *a, float *g, float *beta) {
    if (T < 0 || H < 1 || !ba || !cols || !dt_b || !a || !g || !beta) return -3;
    for (int64_t h = 0; h < 2 * H; h++)
        if (cols[h] < 0 || cols[h] >= ld) return -3;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            gdn_gate(ba[t * ld + cols[H + h]], ba[t * ld + cols[h]], dt_b[h], a[h],
                     g + t * H + h, beta + t * H + h);
    return 0;
}

// gdn_chunk.c, later in this unit: the chunked form's rows and a record's full state
int ls_gdn_chunk(int64_t n_seq, const int64_t *lo, const int64_t *n, void **rec_in,
                 void **rec_out, const float *q, const float *k, const float *v, int64_t v_ld,
                 const float *lg, const float *beta, float scale, float *o, int64_t H, int64_t S,
                 int64_t C, const int64_t *snap_off, const int64_t *snap_row, void **snap_dst,
                 int nthreads);
static void gc_state_head(const float *rec, float *m, int64_t h, int64_t H, int64_t S, int64_t C);
static inline int64_t gc_cnt(int64_t H, int64_t S, int64_t C);

// The chunked form's part of a decode step (w->chunk > 0, recurrent/chunked.py): each row
// through the carried chunk record (nc floats into each record) with ls_gdn_chunk, as a
// prompt row, q and k per value head; its outputs are not the step's (the recurrence's are).
static int gdn_step_chunk(const float *mixed, int64_t ldm, int64_t T, const float *const *st_in,
                          float *const *st_out, const ls_gdn_t *w, const float *act,
                          const float *qk, const float *beta, int nthreads) {
    const int64_t Hk = w->Hk, Hv = w->Hv, S = w->S, vs = Hv * S, r = Hv / Hk;
    const int64_t C = 2 * Hk * S + vs, nc = (w->L - 1) * C;
    float *buf = malloc(sizeof(float) * (size_t)(3 * T * vs + T * Hv));
    int64_t *ints = malloc(sizeof(int64_t) * (size_t)(3 * T + 1));
    void **recs = malloc(sizeof(void *) * (size_t)(2 * T));
    int rc = -2;
    if (buf && ints && recs) {
        float *qe = buf, *ke = qe + T * vs, *oc = ke + T * vs, *lg = oc + T * vs;
        int64_t *lo = ints, *n = lo + T, *off = n + T;
        for (int64_t q = 0; q < T; q++) {
            lo[q] = q, n[q] = 1, off[q] = 0;
            recs[q] = (void *)(st_in[q] + nc), recs[T + q] = st_out[q] + nc;
            const float *ba = mixed + q * ldm + C + vs;
            for (int64_t h = 0; h < Hv; h++) {
                const int64_t kh = w->interleave ? h / r : h % Hk;
                memcpy(qe + (q * Hv + h) * S, qk + (q * 2 * Hk + kh) * S,
                       sizeof(float) * (size_t)S);
                memcpy(ke + (q * Hv + h) * S, qk + (q * 2 * Hk + Hk + kh) * S,
                       sizeof(float) * (size_t)S);
                lg[q * Hv + h] = gdn_log_gate(ba[w->ba_cols[Hv + h]], w->dt_b[h], w->a[h]);
            }
        }
        off[T] = 0;
        rc = ls_gdn_chunk(T, lo, n, recs, recs + T, qe, ke, act + 2 * Hk * S, C, lg, beta,
                          w->scale, oc, Hv, S, w->chunk, off, off, recs, nthreads);
    }
    free(buf), free(ints), free(recs);
    return rc;
}

// mixed [T, ldm]: each row q|k|v [C] (C = 2 Hk S + Hv S), z [Hv S], beta|alpha logits (at
// w->ba_cols from C + Hv S); st_in[q] / st_out[q]: row q's sequence's state record before /
// after the row, [(L-1) C | Hv S S] (with w->chunk: [(L-1) C | chunk record | flag | Hv S S],
// the row one the engine sampled; never the same memory); out [T, Hv S]. Returns 0, -2 out
// of memory, -3 sizes that do not fit (a null pointer, Hk not dividing Hv, L < 2, ldm short of
// the row's C + Hv S + 2 Hv values, a beta/alpha column outside the row, chunk outside
// 0 .. 256), -4 a chunk record whose pending count is not one.
int ls_gdn_step(const float *mixed, int64_t ldm, int64_t T, const float *const *st_in,
                float *const *st_out, const ls_gdn_t *w, float *out, int nthreads) {
    if (!w || T < 1 || w->Hk < 1 || w->Hv < 1 || w->Hv % w->Hk || w->S < 1 || w->L < 2 ||
        !mixed || !st_in || !st_out || !out || !w->taps || !w->ones || !w->ones_s || !w->norm ||
        !w->dt_b || !w->a || !w->ba_cols || w->chunk < 0 || w->chunk > 256)
        return -3;
    const int64_t Hk = w->Hk, Hv = w->Hv, S = w->S, ss = S * S, vs = Hv * S;
    const int64_t C = 2 * Hk * S + vs, nc = (w->L - 1) * C, r = Hv / Hk, K = w->chunk;
    // the chunked form: [conv rows | chunk record (rs) | flag | M]; else [conv rows | M]
    const int64_t rs = K ? gc_cnt(Hv, S, K) + 1 : 0;  // gdn_chunk.py's record_size
    const int64_t mo = K ? nc + rs + 1 : nc;  // M's offset
    if (ldm < C + vs + 2 * Hv) return -3;
    for (int64_t h = 0; h < 2 * Hv; h++)  // inside the row's last ldm - C - Hv S values
        if (w->ba_cols[h] < 0 || w->ba_cols[h] >= ldm - C - vs) return -3;
    for (int64_t q = 0; q < T; q++)
        if (!st_in[q] || !st_out[q]) return -3;
    // act [T, C] after conv and SiLU, pre [C], qk [T, 2 Hk, S] normed, g, beta [T, Hv],
    // o and normed [T, Hv S]
    float *buf = malloc(sizeof(float) * (size_t)(T * C + C + 2 * T * Hk * S + 2 * T * Hv +
                                                 2 * T * vs));
    if (!buf) return -2;
    float *act = buf, *pre = act + T * C, *qk = pre + C, *g = qk + 2 * T * Hk * S;
    float *beta = g + T * Hv, *o = beta + T * Hv, *normed = o + T * vs;
    int rc = 0;
    for (int64_t q = 0; q < T && !rc; q++)
        rc = ls_conv_step(st_in[q], mixed + q * ldm, w->taps, NULL, C, w->L, w->ones, pre,
                          act + q * C, st_out[q]);
    if (!rc) rc = ls_rms_norm(act, T, 2 * Hk, S, C, w->ones_s, 1, w->eps_qk, qk, 1);
    if (!rc) rc = ls_gdn_gates(mixed + C + vs, ldm, T, Hv, w->ba_cols, w->dt_b, w->a, g, beta);
    if (rc) {
        free(buf);
        return -3;
    }
    for (int64_t i = 0; i < 2 * T * Hk * S; i++) qk[i] = qk[i] * w->scale;
    if (K && (rc = gdn_step_chunk(mixed, ldm, T, st_in, st_out, w, act, qk, beta, nthreads))) {
        free(buf);
        return rc == -2 ? -2 : rc == -4 ? -4 : -3;
    }
    const int64_t tasks = T * Hv;
    if (tasks < 2) nthreads = 1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float *mt = malloc((size_t)(2 * ss + 2 * S) * sizeof(float));  // work, a derived M
        if (mt == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (mt == NULL) continue;
            const int64_t q = task / Hv, h = task % Hv, kh = w->interleave ? h / r : h % Hk;
            const float *src = st_in[q] + mo + h * ss, *vr = act + q * C + 2 * Hk * S + h * S;
            const float *qr = qk + (q * 2 * Hk + kh) * S, *kr = qk + (q * 2 * Hk + Hk + kh) * S;
            float *dst = st_out[q] + mo + h * ss, *orow = o + q * vs + h * S;
            if (K && st_in[q][nc + rs] != 1.0f) {  // no live M: the prompt's state
                gc_state_head(st_in[q] + nc, mt + ss + 2 * S, h, Hv, S, K);
                src = mt + ss + 2 * S;
            }
            const float gq = g[q * Hv + h], bq = beta[q * Hv + h];
            head_token(src, dst, kr, qr, vr, gq, bq, w->scale, orow, mt, S);
        }
        free(mt);
    }
    for (int64_t q = 0; q < T && K; q++) st_out[q][nc + rs] = 1.0f;  // M follows: live
    if (!failed) rc = ls_rms_norm(o, T, Hv, S, vs, w->norm, 1, w->eps, normed, 1);
    for (int64_t q = 0; q < T && !failed && !rc; q++)
        rc = ls_gated_act(mixed + q * ldm + C, normed + q * vs, 1, vs, vs, 0, out + q * vs, 1);
    free(buf);
    return failed ? -2 : rc ? -3 : 0;
}
