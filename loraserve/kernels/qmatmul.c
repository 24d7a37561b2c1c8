// Matmuls on GGUF weights in their own format: y[m, n] = sum_k x[m, k] * w[n, k].
//
// Quantized weights: activations are quantized per row in blocks of 32 (int8, one float
// scale per block, as llama.cpp's Q8_0); each weight row is unpacked once per call into
// int8 values with a float scale and offset per 16 (value = s * q + mn); the dot product of
// a 32-value block is an exact integer, and the blocks' float contributions are added in
// one fixed order. Float weights (F32, F16, BF16) keep float32 activations, with the same
// fixed-order accumulation.
//
// Row independence, by construction: y[m, n] is computed by the same sequence of operations
// whatever M is and whichever other rows are present; threads split the output columns n,
// never the sum over k. So a token's result does not depend on its batch.


#include "kquant.h"

// the activation quantizers of quantize.c
void ls_quantize_rows(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                      float *ms, int nthreads);
void ls_quantize_rows_k(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                        int16_t *bs16, int16_t *bs32, int nthreads);

// One call's activations in the forms its parts read: per 32 (q, d, ms: legacy types) and
// per 256 (kq, kd, kbs: K-quants); a form no part reads may be NULL.
typedef struct {
    const int8_t *q;
    const float *d, *ms;
    const float *dT;  // d transposed per 4 rows ([M/4 rounded up][K/32][4]), or NULL
    const int8_t *kq;
    const float *kd;
    const int16_t *kbs, *kbs32;
} act_t;

static int use_direct(int type) {
    // LORASERVE_KERNEL_UNPACK=1: the scalar unpackers for every type (tests compare both)
    return HAVE_DIRECT && direct(type) && getenv("LORASERVE_KERNEL_UNPACK") == NULL;
}

// How one weight matrix is read: its unpacker or in-place decoder, chosen once per call.
typedef struct {
    int type, has_min, in_place, kq;  // kq: a K-quant, on per-256 activations
    unpack_fn unpack;
    dot_fn one, four, eight;
    cols_fn c4;
    kdot_fn k1, k4;
    const uint8_t *w;
    int64_t n, row_bytes, col;  // rows, bytes per row, first output column
} part_t;

static int part_init(part_t *p, int type, const uint8_t *w, int64_t n, int64_t row_bytes,
                     int64_t col) {
    p->unpack = unpacker(type, &p->has_min);
    if (p->unpack == NULL) return -1;
    p->type = type;
    p->in_place = use_direct(type);
    dot_fns(p->in_place ? type : T_BUF, &p->one, &p->four, &p->eight, &p->c4);
    p->kq = is_kquant(type);
    p->k1 = kdot_buf_1;
    p->k4 = kdot_buf_4;
    p->in_place = p->kq ? p->in_place && (type == T_Q4_K || type == T_Q6_K) : p->in_place;
#if defined(__AVX2__)
    if (p->kq && p->in_place) {
        p->k1 = type == T_Q4_K ? kdot_q4_k_1 : kdot_q6_k_1;
        p->k4 = type == T_Q4_K ? kdot_q4_k_4 : kdot_q6_k_4;
    }
#endif
    p->w = w;
    p->n = n;
    p->row_bytes = row_bytes;
    p->col = col;
    return 0;
}

typedef struct {
    int8_t *qbuf;
    float *s, *mn, *sv;
    kprep_t kp;  // a K-quant row's integer scales (qbuf holds its values when unpacked)
    int8_t *qb4[4];  // four rows' buffers and scales, for dot_cols
    float *s4[4], *mn4[4];
} scratch_t;

static void scratch_init(scratch_t *t, int64_t K) {
    const size_t qn = (size_t)((K + 63) / 64 * 64), sn = (size_t)(K / 16);
    t->qbuf = aligned_alloc(64, qn);
    t->s = malloc(sizeof(float) * sn);
    t->mn = calloc(sn, sizeof(float));
    t->sv = malloc(sizeof(float) * (size_t)(8 * (K / 32)));
    t->kp.sc = malloc(sizeof(int16_t) * (sn + 16));
    t->kp.mn = malloc(sizeof(int16_t) * (sn + 16));
    t->kp.d = malloc(sizeof(float) * (size_t)(K / 256 + 1));
    t->kp.dm = malloc(sizeof(float) * (size_t)(K / 256 + 1));
    t->kp.q = t->qbuf;
    for (int j = 0; j < 4; j++) {
        t->qb4[j] = aligned_alloc(64, qn);
        t->s4[j] = malloc(sizeof(float) * sn);
        t->mn4[j] = calloc(sn, sizeof(float));
    }
}

static void scratch_free(scratch_t *t) {
    free(t->qbuf);
    free(t->s);
    free(t->mn);
    free(t->sv);
    free(t->kp.sc);
    free(t->kp.mn);
    free(t->kp.d);
    free(t->kp.dm);
    for (int j = 0; j < 4; j++) {
        free(t->qb4[j]);
        free(t->s4[j]);
        free(t->mn4[j]);
    }
}

// Output columns p->col + n0 .. + 3 of rows m < M (M < 4): four weight rows at a time.
static void part_cols4(const part_t *p, int64_t n0, int64_t K, const act_t *a, int64_t M,
                       float *y, int64_t ldy, scratch_t *t) {
    const int64_t nc = K / 32;
    const uint8_t *rows[4];
    for (int j = 0; j < 4; j++) {
        rows[j] = p->w + (n0 + j) * p->row_bytes;
        if (p->in_place) row_scales(p->type, rows[j], K, t->s4[j], t->mn4[j]);
        else p->unpack(rows[j], K, t->qb4[j], t->s4[j], t->mn4[j]);
    }
    for (int64_t m = 0; m < M; m++) {
        float out[4];
        p->c4(rows, t->qb4, t->s4, t->mn4, p->has_min, a->q + m * K, a->d + m * nc,
              a->ms + m * (K / 16), K, out);
        for (int j = 0; j < 4; j++) y[m * ldy + p->col + n0 + j] = out[j];
    }
}

// Output column (p->col + n) of all M rows of a K-quant part: one weight row against every
// activation row, 4 at a time (the same numbers as one at a time: kquant.h).
static void part_row_k(const part_t *p, int64_t n, int64_t K, const act_t *a, int64_t M,
                       float *y, int64_t ldy, scratch_t *t) {
    const uint8_t *row = p->w + n * p->row_bytes;
    if (!p->in_place) k_prepare(p->type, row, K, &t->kp, 1, t->s, t->mn);
    float *out = y + p->col + n;
    const int64_t nb = K / 256, n16 = K / 16;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)
        p->k4(row, &t->kp, p->has_min, a->kq + m * K, a->kd + m * nb, a->kbs + m * n16,
              a->kbs32 + m * (K / 32), K, out + m * ldy, ldy);
    for (; m < M; m++)
        p->k1(row, &t->kp, p->has_min, a->kq + m * K, a->kd + m * nb, a->kbs + m * n16,
              a->kbs32 + m * (K / 32), K, out + m * ldy, ldy);
}

// Output column (p->col + n) of all M rows: one weight row against every activation row.
static void part_row(const part_t *p, int64_t n, int64_t K, const act_t *a, int64_t M,
                     float *y, int64_t ldy, scratch_t *t) {
    if (p->kq) {
        part_row_k(p, n, K, a, M, y, ldy, t);
        return;
    }
    const int64_t nc = K / 32;
    const uint8_t *row = p->w + n * p->row_bytes;
    if (p->in_place) row_scales(p->type, row, K, t->s, t->mn);
    else p->unpack(row, K, t->qbuf, t->s, t->mn);
    if (M >= 4 && !(p->in_place && UNIFORM(p->type)))
        for (int64_t c = 0; c < nc; c++)
            for (int l = 0; l < 4; l++) {
                t->sv[8 * c + l] = t->s[2 * c];
                t->sv[8 * c + 4 + l] = t->s[2 * c + 1];
            }
    float *out = y + p->col + n;
    int64_t m = 0;
#define LS_DT(m) (a->dT != NULL ? a->dT + (m) / 4 * nc * 4 : NULL)
    for (; m + 8 <= M; m += 8)
        p->eight(row, t->qbuf, t->s, t->sv, t->mn, p->has_min, a->q + m * K, a->d + m * nc,
                 LS_DT(m), a->ms + m * (K / 16), K, out + m * ldy, ldy);
    for (; m + 4 <= M; m += 4)
        p->four(row, t->qbuf, t->s, t->sv, t->mn, p->has_min, a->q + m * K, a->d + m * nc,
                LS_DT(m), a->ms + m * (K / 16), K, out + m * ldy, ldy);
#undef LS_DT
    for (; m < M; m++)
        p->one(row, t->qbuf, t->s, t->sv, t->mn, p->has_min, a->q + m * K, a->d + m * nc, NULL,
               a->ms + m * (K / 16), K, out + m * ldy, ldy);
}

// Decode rows (M < 4) read 4 weight rows per activation row (part_cols4) in a matrix of up
// to this size, one weight row at a time above it. Measured (Zen 2, 2 threads): 4 rows at a
// time are 13-15% faster on the cache-resident layer matrices of Gemma 270M (Q5_0 2048 x
// 640: 0.059 vs 0.069 ms), where the one-row chain of multiply-adds is the limit; on the
// 168 MB Q8_0 output matrix, which streams from memory, one row at a time is 10% faster
// (8.5 vs 9.5 ms: shorter bursts of compute between the rows' loads). Same bits either way.
#define COLS4_MAX_BYTES ((int64_t)8 << 20)

// Several matrices of one input side by side on the output columns (q|k|v, gate|up), in
// one parallel region: y[:, cols[i] : cols[i] + ns[i]] = x W_i^T. The rows of all parts
// form one range that the threads split. Returns 0, or -1 for a type without a kernel.
static int qmatmul_multi(int nparts, const int *types, const uint8_t *const *ws,
                         const int64_t *ns, const int64_t *row_bytes, const int64_t *cols,
                         int64_t K, const act_t *a, int64_t M, float *y, int64_t ldy,
                         int nthreads) {
    part_t parts[8];
    int64_t total = 0;
    if (nparts < 1 || nparts > 8) return -1;
    for (int i = 0; i < nparts; i++) {
        if (part_init(&parts[i], types[i], ws[i], ns[i], row_bytes[i], cols[i]) != 0) return -1;
        if (parts[i].kq ? (K % 256 != 0 || a->kq == NULL) : a->q == NULL) return -1;
        total += ns[i];
    }
    if (total * K * M < (1 << 17)) nthreads = 1;  // tiny products: no thread wake-up
    // tasks: blocks of 4 rows of one part (the last block of a part may be shorter)
    int64_t first[9];
    first[0] = 0;
    for (int i = 0; i < nparts; i++) first[i + 1] = first[i] + (parts[i].n + 3) / 4;
    const int64_t n_tasks = first[nparts];
#pragma omp parallel num_threads(nthreads)
    {
        scratch_t t;
        scratch_init(&t, K);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < n_tasks; g++) {
            int i = 0;
            while (g >= first[i + 1]) i++;
            const part_t *p = &parts[i];
            const int64_t n0 = 4 * (g - first[i]), n1 = n0 + 4 < p->n ? n0 + 4 : p->n;
            if (M < 4 && n1 - n0 == 4 && !p->kq && p->n * p->row_bytes <= COLS4_MAX_BYTES) {
                part_cols4(p, n0, K, a, M, y, ldy, &t);
            } else {
                for (int64_t n = n0; n < n1; n++) part_row(p, n, K, a, M, y, ldy, &t);
            }
        }
        scratch_free(&t);
    }
    return 0;
}

// The activation scales d [M, nc] transposed per 4 rows into dT [(M + 3) / 4][nc][4] (the
// rows past M: 0), as the 4- and 8-row dot products read them; NULL when out of memory.
static float *transpose_scales(const float *d, int64_t M, int64_t nc) {
    const int64_t groups = (M + 3) / 4;
    float *dT = calloc((size_t)(groups * nc * 4 + 1), sizeof(float));
    if (dT != NULL)
        for (int64_t m = 0; m < M; m++)
            for (int64_t c = 0; c < nc; c++) dT[(m / 4 * nc + c) * 4 + m % 4] = d[m * nc + c];
    return dT;
}

// The quantized matmul from float32 activations x [M, K] (row stride ldx), quantized here
// in the forms the parts read, in one call (a decode step makes ~70 of these; each saved
// round trip is ~15 us). Returns 0, -1 for a refused type, -2 when out of memory.
int ls_qmatmul_multi_f32(int nparts, const int *types, const uint8_t *const *ws,
                         const int64_t *ns, const int64_t *row_bytes, const int64_t *cols,
                         int64_t K, const float *x, int64_t ldx, int64_t M, float *y,
                         int64_t ldy, int nthreads) {
    int legacy = 0, kq = 0;
    for (int i = 0; i < nparts && i < 8; i++) {
        if (is_kquant(types[i])) kq = 1;
        else legacy = 1;
    }
    if (kq && K % 256 != 0) return -1;
    int8_t *q = legacy ? malloc((size_t)(M * K)) : NULL;
    float *d = legacy ? malloc(sizeof(float) * (size_t)(M * (K / 32))) : NULL;
    float *ms = legacy ? malloc(sizeof(float) * (size_t)(M * (K / 16))) : NULL;
    int8_t *k8 = kq ? malloc((size_t)(M * K)) : NULL;
    float *kd = kq ? malloc(sizeof(float) * (size_t)(M * (K / 256) + 1)) : NULL;
    int16_t *b16 = kq ? malloc(sizeof(int16_t) * (size_t)(M * (K / 16) + 1)) : NULL;
    int16_t *b32 = kq ? malloc(sizeof(int16_t) * (size_t)(M * (K / 32) + 1)) : NULL;
    int rc = -2;
    if ((!legacy || (q && d && ms)) && (!kq || (k8 && kd && b16 && b32))) {
        if (legacy) ls_quantize_rows(x, M, K, ldx, q, d, ms, nthreads);
        if (kq) ls_quantize_rows_k(x, M, K, ldx, k8, kd, b16, b32, nthreads);
        float *dT = legacy && M >= 4 ? transpose_scales(d, M, K / 32) : NULL;
        const act_t a = {q, d, ms, dT, k8, kd, b16, b32};
        rc = qmatmul_multi(nparts, types, ws, ns, row_bytes, cols, K, &a, M, y, ldy, nthreads);
        free(dT);
    }
    free(q);
    free(d);
    free(ms);
    free(k8);
    free(kd);
    free(b16);
    free(b32);
    return rc;
}

// y [M, N] (row stride ldy) = quantized activations x weight rows w [N, row_bytes] of ggml
// `type`: legacy types read (xq, xd, xms) from ls_quantize_rows, K-quants read (xq, xd,
// bs16, bs32) from ls_quantize_rows_k (xbs32 NULL for legacy types). Returns 0, or -1 for
// a type without a kernel.
int ls_qmatmul(int type, const uint8_t *w, int64_t N, int64_t K, int64_t row_bytes,
               const int8_t *xq, const float *xd, const void *xms, const int16_t *xbs32,
               int64_t M, float *y, int64_t ldy, int nthreads) {
    const uint8_t *ws[1] = {w};
    const int64_t zero = 0;
    float *dT = !is_kquant(type) && M >= 4 ? transpose_scales(xd, M, K / 32) : NULL;
    act_t a = {xq, xd, (const float *)xms, dT, NULL, NULL, NULL, NULL};
    if (is_kquant(type)) a = (act_t){NULL, NULL, NULL, NULL, xq, xd, (const int16_t *)xms, xbs32};
    const int rc = qmatmul_multi(1, &type, ws, &N, &row_bytes, &zero, K, &a, M, y, ldy, nthreads);
    free(dT);
    return rc;
}
