// The buffers of one grouped expert call (moe.c): its workspace, carved by a counting pass
// then the same takes on the real memory, and the activations quantized per sorted row in
// the forms the projection's parts read.

#pragma once

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#if !defined(MAP_ANONYMOUS) && defined(__linux__)
#define MAP_ANONYMOUS 0x20  // hidden by -std=c11 (no _DEFAULT_SOURCE); its Linux value
#endif

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

// One workspace of up to this size is kept for the process between calls: a prompt's
// buffers (~42 MB for 512 tokens of Qwen3-30B-A3B shapes) faulted in and zeroed anew by
// the kernel every call cost ~20% of its MoE layer's CPU time (measured, 1 thread). A call
// takes it (grown to what the call needs, never past this), gives it back after, and
// `ls_moe_release` unmaps it (the Python side calls it when the last grouped layer goes).
// mmap'd, not malloc'd, so its pages go back to the system when it goes.
#define WS_KEEP_MAX ((size_t)64 << 20)
static pthread_mutex_t ws_lock = PTHREAD_MUTEX_INITIALIZER;
static char *ws_base;  // the kept workspace (NULL: none, or taken by a call)
static size_t ws_cap;

typedef struct {
    char *base;
    size_t cap;
} wspace_t;

// n bytes for one call (NULL base when out of memory): the kept workspace when it is
// large enough, else a new mapping (the kept one unmapped first, so that the two are never
// resident at once); `ws_give` hands it back.
static wspace_t ws_take(size_t n) {
    n = (n + 4095) & ~(size_t)4095;
    if (n == 0) n = 4096;
    pthread_mutex_lock(&ws_lock);
    wspace_t w = {ws_base, ws_cap};
    ws_base = NULL, ws_cap = 0;
    pthread_mutex_unlock(&ws_lock);
    if (w.base != NULL && w.cap >= n) return w;
    if (w.base != NULL) munmap(w.base, w.cap);
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? (wspace_t){NULL, 0} : (wspace_t){p, n};
}

// The call's workspace back: kept when it fits WS_KEEP_MAX and is larger than the kept
// one (which is then unmapped), else unmapped.
static void ws_give(wspace_t w) {
    if (w.base == NULL) return;
    pthread_mutex_lock(&ws_lock);
    if (w.cap <= WS_KEEP_MAX && w.cap > ws_cap) {
        const wspace_t old = {ws_base, ws_cap};
        ws_base = w.base, ws_cap = w.cap;
        w = old;
    }
    pthread_mutex_unlock(&ws_lock);
    if (w.base != NULL) munmap(w.base, w.cap);
}

// Unmaps the kept workspace (a call in flight keeps its own until it ends).
void ls_moe_release(void) {
    pthread_mutex_lock(&ws_lock);
    const wspace_t w = {ws_base, ws_cap};
    ws_base = NULL, ws_cap = 0;
    pthread_mutex_unlock(&ws_lock);
    if (w.base != NULL) munmap(w.base, w.cap);
}

// Bytes of the kept workspace (0: none).
int64_t ls_moe_workspace_bytes(void) {
    pthread_mutex_lock(&ws_lock);
    const int64_t n = (int64_t)ws_cap;
    pthread_mutex_unlock(&ws_lock);
    return n;
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

// Each block of dT of experts e0..e1-1 (the padding rows 0), once the rows are routed.
static void abuf_blocks(abuf_t *b, int64_t e0, int64_t e1, const int64_t *off) {
    if (b->dt_off == NULL) return;
    int64_t total = 0;
    for (int64_t e = e0; e < e1; e++) {
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
