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

#include "qparts.h"

// the activation quantizers of quantize.c
int ls_quantize_rows(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                     float *ms, int16_t *bs, int nthreads);
int ls_quantize_rows_k(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                       int16_t *bs16, int16_t *bs32, int nthreads);

// Decode rows (M < 4) of a legacy-type matrix read 4 weight rows per activation row
// (part_cols4: four independent chains of multiply-adds), except a single row in a matrix
// above COLS4_MAX_BYTES, which reads one weight row at a time. Measured (Zen 2, 2 threads,
// with the read-ahead of simd.h): Gemma 1B's 5.5 MB Q5_0 gate matrix at 1 / 2 / 3 rows
// 0.88x / 0.79x / 0.78x the time of one row at a time, and 1B's decode steps 3% faster
// (medians of 60 steps, 3 interleaved runs); the 168 MB Q8_0 output matrix of Gemma 270M
// at 2 / 3 rows 0.69x / 0.66x, at one row 0.97x, and 1B's 302 MB one 1.03x. Same bits
// either way.
#define COLS4_MAX_BYTES ((int64_t)8 << 20)

// Whether the sizes of a matmul fit each other: 1 to 8 parts, each part's rows at least as
// long as K values of its type (K whole blocks), its columns inside y's rows (cols[i] + ns[i]
// <= ldy), M >= 0. Returns 0, -1 for a type without a kernel, -3 for sizes that do not fit.
static int check_sizes(int nparts, const int *types, const int64_t *ns, const int64_t *row_bytes,
                       const int64_t *cols, int64_t K, int64_t M, int64_t ldy) {
    if (nparts < 1 || nparts > 8 || M < 0 || K < 1) return -3;
    for (int i = 0; i < nparts; i++) {
        const int64_t need = part_row_bytes(types[i], K);
        if (need < 0) return unpacker(types[i] & ~PACKED, &(int){0}) == NULL ? -1 : -3;
        if (row_bytes[i] < need || ns[i] < 0 || cols[i] < 0 || cols[i] + ns[i] > ldy) return -3;
    }
    return 0;
}

// Several matrices of one input side by side on the output columns (q|k|v, gate|up), in
// one parallel region: y[:, cols[i] : cols[i] + ns[i]] = x W_i^T. The rows of all parts
// form one range that the threads split. Returns 0, -1 for a type without a kernel, -3 for
// sizes that do not fit (`check_sizes`).
static int qmatmul_multi(int nparts, const int *types, const uint8_t *const *ws,
                         const int64_t *ns, const int64_t *row_bytes, const int64_t *cols,
                         int64_t K, const act_t *a, int64_t M, float *y, int64_t ldy,
                         int nthreads) {
    part_t parts[8];
    int64_t total = 0;
    const int rc = check_sizes(nparts, types, ns, row_bytes, cols, K, M, ldy);
    if (rc != 0) return rc;
    for (int i = 0; i < nparts; i++) {
        if (part_init(&parts[i], types[i], ws[i], ns[i], row_bytes[i], cols[i]) != 0) return -1;
        if (parts[i].kq ? (K % 256 != 0 || a->kq == NULL) : a->q == NULL) return -1;
        parts[i].kbytes = part_kbytes_on(&parts[i], M);
        total += ns[i];
    }
    if (total * K * M < (1 << 17)) nthreads = 1;  // tiny products: no thread wake-up
    // tasks: blocks of 4 rows of one part (the last block of a part may be shorter), or of
    // pgs[i] packed groups (pk_task_groups)
    int64_t first[9], pgs[8];
    first[0] = 0;
    for (int i = 0; i < nparts; i++) {
        pgs[i] = parts[i].packed || M >= ROWS_MIN_M ? pk_task_groups(parts[i].type, M) : 1;
        first[i + 1] = first[i] + (parts[i].packed || parts[i].kbytes
                                       ? (parts[i].n / PK_ROWS + pgs[i] - 1) / pgs[i]
                                       : (parts[i].n + 3) / 4);
    }
    const int64_t n_tasks = first[nparts];
    // runs of tasks taken from a shared counter (about 16 a thread): a thread the system
    // preempts leaves its runs to the others; every task's rows have the same bits whoever
    // runs it
    const int64_t run = nthreads > 1 && n_tasks / (16 * nthreads) > 1 ? n_tasks / (16 * nthreads) : 1;
#pragma omp parallel num_threads(nthreads)
    {
        scratch_t t;
        scratch_init(&t, K);
#pragma omp for schedule(dynamic, run)
        for (int64_t g = 0; g < n_tasks; g++) {
            int i = 0;
            while (g >= first[i + 1]) i++;
            const part_t *p = &parts[i];
            const int64_t pg = pgs[i];
            if (p->kbytes) {  // decoded groups (M >= ROWS_MIN_M, so pg groups a task)
                const int64_t g0 = pg * (g - first[i]), left = p->n / PK_ROWS - g0;
                part_kbytes(p, PK_ROWS * g0, left < pg ? left : pg, K, a, M, y, ldy, &t);
                continue;
            }
            if (p->packed) {
                const int64_t g0 = pg * (g - first[i]), left = p->n / PK_ROWS - g0;
                part_packed(p, PK_ROWS * g0, left < pg ? left : pg, K, a, M, y, ldy);
                continue;
            }
            const int64_t n0 = 4 * (g - first[i]), n1 = n0 + 4 < p->n ? n0 + 4 : p->n;
            if (M < 4 && n1 - n0 == 4 && !p->kq &&
                (M > 1 || p->n * p->row_bytes <= COLS4_MAX_BYTES)) {
                part_cols4(p, n0, K, a, M, y, ldy, &t);
            } else if (M >= ROWS_MIN_M) {
                part_rows(p, n0, n1, K, a, M, y, ldy, &t);
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
// round trip is ~15 us). Returns 0, -1 for a refused type, -2 when out of memory, -3 for
// sizes that do not fit (a weight row shorter than K values, columns past y's rows, ldx < K).
int ls_qmatmul_multi_f32(int nparts, const int *types, const uint8_t *const *ws,
                         const int64_t *ns, const int64_t *row_bytes, const int64_t *cols,
                         int64_t K, const float *x, int64_t ldx, int64_t M, float *y,
                         int64_t ldy, int nthreads) {
    const int sizes = check_sizes(nparts, types, ns, row_bytes, cols, K, M, ldy);
    if (sizes != 0) return sizes;
    if (ldx < K || K % 32 != 0) return -3;
    int legacy = 0, kq = 0, rows = 0;  // rows: a legacy part in the file's layout (reads dT)
    for (int i = 0; i < nparts && i < 8; i++) {
        if (is_kquant(types[i] & ~PACKED)) kq = 1;
        else legacy = 1, rows |= !(types[i] & PACKED);
    }
    if (kq && K % 256 != 0) return -1;
    int8_t *q = legacy ? malloc((size_t)(M * K)) : NULL;
    float *d = legacy ? malloc(sizeof(float) * (size_t)(M * (K / 32))) : NULL;
    float *ms = legacy ? malloc(sizeof(float) * (size_t)(M * (K / 16))) : NULL;
    int16_t *bs = legacy ? malloc(sizeof(int16_t) * (size_t)(M * (K / 32) + 1)) : NULL;
    int8_t *k8 = kq ? malloc((size_t)(M * K)) : NULL;
    float *kd = kq ? malloc(sizeof(float) * (size_t)(M * (K / 256) + 1)) : NULL;
    int16_t *b16 = kq ? malloc(sizeof(int16_t) * (size_t)(M * (K / 16) + 1)) : NULL;
    int16_t *b32 = kq ? malloc(sizeof(int16_t) * (size_t)(M * (K / 32) + 1)) : NULL;
    int rc = -2;
    if ((!legacy || (q && d && ms && bs)) && (!kq || (k8 && kd && b16 && b32))) {
        if (legacy) ls_quantize_rows(x, M, K, ldx, q, d, ms, bs, nthreads);
        if (kq) ls_quantize_rows_k(x, M, K, ldx, k8, kd, b16, b32, nthreads);
        float *dT = rows && M >= 4 ? transpose_scales(d, M, K / 32) : NULL;
        const act_t a = {q, d, ms, bs, dT, k8, kd, b16, b32};
        rc = qmatmul_multi(nparts, types, ws, ns, row_bytes, cols, K, &a, M, y, ldy, nthreads);
        free(dT);
    }
    free(q);
    free(d);
    free(ms);
    free(bs);
    free(k8);
    free(kd);
    free(b16);
    free(b32);
    return rc;
}

// y [M, N] (row stride ldy) = quantized activations x weight rows w [N, row_bytes] of ggml
// `type`: legacy types read (xq, xd, xms, xbs32 = bs) from ls_quantize_rows, K-quants read
// (xq, xd, bs16, bs32) from ls_quantize_rows_k. Returns 0, -1 for a type without a kernel,
// -3 for sizes that do not fit (rows shorter than K values, ldy < N).
int ls_qmatmul(int type, const uint8_t *w, int64_t N, int64_t K, int64_t row_bytes,
               const int8_t *xq, const float *xd, const void *xms, const int16_t *xbs32,
               int64_t M, float *y, int64_t ldy, int nthreads) {
    const uint8_t *ws[1] = {w};
    const int64_t zero = 0;
    const int sizes = check_sizes(1, &type, &N, &row_bytes, &zero, K, M, ldy);
    if (sizes != 0) return sizes;  // before the scales below are read (issue 31)
    // the 4- and 8-row dot products of legacy rows in the file's layout read d transposed
    const int rows = !(type & PACKED) && !is_kquant(type);
    float *dT = rows && M >= 4 ? transpose_scales(xd, M, K / 32) : NULL;
    act_t a = {xq, xd, (const float *)xms, xbs32, dT, NULL, NULL, NULL, NULL};
    if (is_kquant(type & ~PACKED))
        a = (act_t){NULL, NULL, NULL, NULL, NULL, xq, xd, (const int16_t *)xms, xbs32};
    const int rc = qmatmul_multi(1, &type, ws, &N, &row_bytes, &zero, K, &a, M, y, ldy, nthreads);
    free(dT);
    return rc;
}

// The instruction sets this build's integer dot products use (bits): 1 AVX2 (maddubs/madd),
// 2 AVX-512 VNNI on 256-bit vectors (dpbusd: the same exact sums, fewer instructions),
// 4 AVX-512F present at all. Tests compare the outputs of builds with and without them.
int ls_isa(void) {
    int bits = 0;
#if defined(__AVX2__)
    bits |= 1;
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    bits |= 2;
#endif
#if defined(__AVX512F__)
    bits |= 4;
#endif
    return bits;
}
