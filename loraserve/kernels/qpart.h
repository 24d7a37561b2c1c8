// One weight matrix of a quantized matmul call ("a part"): its type, how its rows are read
// (in place, unpacked, or packed) and the dot products chosen once per call; and the call's
// activations in the forms the parts read.

#pragma once

#include <stdlib.h>

#include "kdots.h"
#include "packed.h"

// One call's activations in the forms its parts read: per 32 (q, d, ms: legacy types) and
// per 256 (kq, kd, kbs: K-quants); a form no part reads may be NULL.
typedef struct {
    const int8_t *q;
    const float *d, *ms;
    const int16_t *bs;  // the sums of q per 32 (legacy types; NULL where no part reads them)
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
    int packed;  // rows repacked in groups of 8 (packed.h; n a multiple of 8)
    int kbytes;  // read through decoded groups of 8 rows (packed_kb.h; set per call by M)
    unpack_fn unpack;
    dot_fn one, four, eight;
    dot_fn bu4, bu8;  // Q4_0 / Q5_0 / MXFP4 in place: 4, 8 rows on values decoded once (or NULL)
    cols_fn c4;
    kdot_fn k1, k4;
    const uint8_t *w;
    int64_t n, row_bytes, col;  // rows, bytes per row, first output column
} part_t;

// The bytes of one weight row of K values of kernel type `type` (PACKED | ggml type: its
// share of a packed group), or -1 for a type without a kernel or a K that is not whole blocks:
// every matmul compares it with the row stride it is given before reading a row.
static inline int64_t part_row_bytes(int type, int64_t K) {
    if (type & PACKED) {
        const int64_t gb = packed_group_bytes(type & ~PACKED, K);
        return gb > 0 && K % packed_block(type & ~PACKED) == 0 ? gb / PK_ROWS : -1;
    }
    int64_t block = 32, size;
    switch (type) {
    case T_Q4_0: size = 18; break;
    case T_Q4_1: size = 20; break;
    case T_Q5_0: size = 22; break;
    case T_Q5_1: size = 24; break;
    case T_Q8_0: size = 34; break;
    case T_Q2_K: block = 256, size = 84; break;
    case T_Q3_K: block = 256, size = 110; break;
    case T_Q4_K: block = 256, size = 144; break;
    case T_Q5_K: block = 256, size = 176; break;
    case T_Q6_K: block = 256, size = 210; break;
    default:
        size = nl_block_bytes(type, &block);
        if (size == 0) return -1;
    }
    return K > 0 && K % block == 0 ? K / block * size : -1;
}

static int part_init(part_t *p, int type, const uint8_t *w, int64_t n, int64_t row_bytes,
                     int64_t col) {
    p->packed = (type & PACKED) != 0;
    p->kbytes = 0;
    if (p->packed) {
        type &= ~PACKED;
        if (!packable(type) || n % PK_ROWS != 0) return -1;
    }
    p->unpack = unpacker(type, &p->has_min);
    if (p->unpack == NULL) return -1;
    p->type = type;
    p->in_place = use_direct(type);
    dot_fns(p->in_place ? type : T_BUF, &p->one, &p->four, &p->eight, &p->c4);
    p->bu4 = p->bu8 = NULL;
#if defined(__AVX2__)
    if (p->in_place && (type == T_Q4_0 || type == T_Q5_0 || type == T_MXFP4))
        p->bu4 = dot_bufu_4, p->bu8 = dot_bufu_8;
#endif
    p->kq = is_kquant(type);
    p->k1 = kdot_buf_1;
    p->k4 = kdot_buf_4;
    if (p->kq) {  // the in-place dot products where the type has them (kquant.h)
        kdot_fn k1, k4;
        if (p->in_place && kdot_in_place(type, &k1, &k4)) p->k1 = k1, p->k4 = k4;
        else p->in_place = 0;
    }
    p->w = w;
    p->n = n;
    p->row_bytes = row_bytes;
    p->col = col;
    return 0;
}
