// The gated delta rule's per-token recurrence (`model/recurrent/deltanet.py`) in one call per
// layer and step: every (sequence, value head) pair in parallel, each sequence's tokens in
// order. Per token t and value head h, with M [S (value), S (key)] the head's state:
//
//     M <- M * g;  d = (v - M k) * beta;  M <- M + d k^T;  o = (M q) * scale
//
// with exactly the float operations of the torch reference, in its order: every product is
// rounded before it is added (-ffp-contract=off), and each of M k and M q sums over the key
// index from 0 upwards starting at 0 (what torch's bmm does for more than one head). The
// head's M is held transposed (MT[j][i] = M[i][j]) while it runs, so the loops over the value
// index i are independent lanes the compiler vectorizes without reordering any sum.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void transpose(const float *a, float *b, int64_t s) {  // b[j][i] = a[i][j]
    enum { TILE = 16 };  // tiles: a's rows and b's rows both stay in a few cache lines
    for (int64_t i0 = 0; i0 < s; i0 += TILE)
        for (int64_t j0 = 0; j0 < s; j0 += TILE) {
            const int64_t i1 = i0 + TILE < s ? i0 + TILE : s, j1 = j0 + TILE < s ? j0 + TILE : s;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1; j++) b[j * s + i] = a[i * s + j];
        }
}

// n_seq sequences; sequence z owns rows lo[z] .. lo[z] + n[z] - 1 of q, k [T, H, S]
// (contiguous), v (row stride v_ld, heads contiguous), g and beta [T, H], o [T, H, S]. Its
// state M [H, S, S] is read from m_in[z] and the state after its last row written to m_out[z]
// (m_in is never written). Snapshots: for e in snap_off[z] .. snap_off[z+1] - 1, the state
// after its row snap_row[e] (counted from lo[z], ascending) goes to snap_dst[e] [H, S, S].
// Returns 0, or -1 when a work buffer could not be allocated (outputs then undefined).
int ls_gdn_recur(int64_t n_seq, const int64_t *lo, const int64_t *n, const float *const *m_in,
                 float *const *m_out, const float *q, const float *k, const float *v,
                 int64_t v_ld, const float *g, const float *beta, float scale, float *o,
                 int64_t H, int64_t S, const int64_t *snap_off, const int64_t *snap_row,
                 float *const *snap_dst, int nthreads) {
    int failed = 0;
    const int64_t tasks = n_seq * H, ss = S * S;
    if (tasks < 2) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
        float *mt = malloc((size_t)(ss + 2 * S) * sizeof(float));
        if (mt == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (mt == NULL) continue;
            const int64_t z = task / H, h = task % H;
            float *acc = mt + ss, *d = acc + S;
            transpose(m_in[z] + h * ss, mt, S);
            int64_t e = snap_off[z];
            for (int64_t r = 0; r < n[z]; r++) {
                const int64_t row = lo[z] + r;
                const float *kr = k + (row * H + h) * S, *qr = q + (row * H + h) * S;
                const float *vr = v + row * v_ld + h * S;
                const float gr = g[row * H + h], br = beta[row * H + h];
                for (int64_t i = 0; i < S; i++) acc[i] = 0.0f;
                for (int64_t j = 0; j < S; j++) {  // M <- M g; acc = M k
                    float *c = mt + j * S;
                    const float kj = kr[j];
                    for (int64_t i = 0; i < S; i++) {
                        c[i] = c[i] * gr;
                        acc[i] = acc[i] + c[i] * kj;
                    }
                }
                for (int64_t i = 0; i < S; i++) {
                    d[i] = (vr[i] - acc[i]) * br;
                    acc[i] = 0.0f;
                }
                for (int64_t j = 0; j < S; j++) {  // M <- M + d k^T; acc = M q
                    float *c = mt + j * S;
                    const float kj = kr[j], qj = qr[j];
                    for (int64_t i = 0; i < S; i++) {
                        c[i] = c[i] + d[i] * kj;
                        acc[i] = acc[i] + c[i] * qj;
                    }
                }
                float *orow = o + (row * H + h) * S;
                for (int64_t i = 0; i < S; i++) orow[i] = acc[i] * scale;
                for (; e < snap_off[z + 1] && snap_row[e] == r; e++)
                    transpose(mt, snap_dst[e] + h * ss, S);
            }
            transpose(mt, m_out[z] + h * ss, S);
        }
        free(mt);
    }
    return failed ? -1 : 0;
}
