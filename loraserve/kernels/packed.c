// Repacking ggml rows into the 8-row layouts of packed.h (once, at load) and back (exact:
// unpack(pack(rows)) gives the file's bytes again, which the tests check), and the packed
// matmul tiles that qmatmul.c's tasks call (a unit of their own: the kernels compile in
// parallel with qmatmul.c's, which a cold first start waits for).

#include "packed_k.h"
#include "packed_kb.h"
#include "packed_nl.h"
#include "packed_q3.h"
#include "packed_xs.h"
#include "packed_zb.h"
#include "packed_zk.h"

// Whether R (1..4) rows of K values against a group of packable `type` fit: K whole blocks
// of the type, out rows at least `width` apart (issue 31: every C entry point checks its
// sizes rather than trusting its caller).
static inline int tile_fits(int type, const uint8_t *g, const int8_t *x, const float *xd,
                            int64_t K, int R, float *out, int64_t ldy, int64_t width) {
    return packed_group_bytes(type, K) > 0 && K % packed_block(type) == 0 && R >= 1 && R <= 4 &&
           (R == 1 || ldy >= width) && g && x && xd && out;
}

// Returns 0, or -3 for sizes that do not fit.
int ls_packed_tile(int type, const uint8_t *g, const int8_t *x, const float *xd,
                   const int16_t *bs32, int64_t K, int R, int ahead, float *out, int64_t ldy) {
    if (!tile_fits(type, g, x, xd, K, R, out, ldy, PK_ROWS)) return -3;
#define LS_T(RR)                                                                              \
    do {                                                                                      \
        if (type == T_Q8_0) pk_dot_q8_0(g, x, xd, K, RR, ahead, out, ldy);                    \
        else if (type == T_Q5_0 || type == T_Q4_0 || type == T_Q5_1)                          \
            pk_dot_q5_0(g, type == T_Q5_1 ? 2 : type == T_Q5_0, x, xd, bs32, K, RR, ahead, out, ldy); \
        else if (type == T_IQ4_NL) pk_dot_iq4_nl(g, 0, x, xd, bs32, K, RR, ahead, out, ldy);  \
        else if (type == T_MXFP4) pk_dot_iq4_nl(g, 1, x, xd, bs32, K, RR, ahead, out, ldy);   \
        else if (type == T_IQ4_XS) pk_dot_iq4_xs(g, x, xd, bs32, K, RR, ahead, out, ldy);     \
        else if (type == T_Q6_K) pq6_dot(g, x, xd, bs32, K, RR, ahead, out, ldy);             \
        else if (type == T_Q3_K) pq3_dot(g, 0, x, xd, bs32, K, RR, ahead, out, ldy);          \
        else if (type == T_Q2_K) pq3_dot(g, 1, x, xd, bs32, K, RR, ahead, out, ldy);          \
        else if (type == T_TQ2_0) pq3_dot(g, 2, x, xd, bs32, K, RR, ahead, out, ldy);         \
        else if (type == T_Q5_K) pk_dot_q4_k(g, 1, x, xd, bs32, K, RR, ahead, out, ldy);     \
        else pk_dot_q4_k(g, 0, x, xd, bs32, K, RR, ahead, out, ldy);                          \
    } while (0)
    PK_BY_ROWS(R, LS_T);
#undef LS_T
    return 0;
}

// Groups g and g + gb together (pz_pairs' types): R (1..4) activation rows against 16
// weight rows, out[r * ldy + 0..15]; the bits of two ls_packed_tile calls. Returns 0, or -3
// for sizes that do not fit (gb less than a group, a type without pair tiles here).
int ls_packed_tile2(int type, const uint8_t *g, int64_t gb, const int8_t *x, const float *xd,
                    const int16_t *bs32, int64_t K, int R, int ahead, float *out, int64_t ldy) {
    if (!tile_fits(type, g, x, xd, K, R, out, ldy, 2 * PK_ROWS) ||
        gb < packed_group_bytes(type, K))
        return -3;
#if PZ_PAIRS
    if (!pz_pairs(type)) return -3;
    const int hb = type == T_Q5_1 ? 2 : type == T_Q5_0;
#define LS_T(RR)                                                                              \
    do {                                                                                      \
        if (type == T_Q4_K) pz_dot_q4_k(g, gb, 0, x, xd, bs32, K, RR, ahead, out, ldy);        \
        else if (type == T_Q5_K) pz_dot_q4_k(g, gb, 1, x, xd, bs32, K, RR, ahead, out, ldy);   \
        else if (type == T_IQ4_NL) pz_dot_iq4_nl(g, gb, 0, x, xd, bs32, K, RR, ahead, out, ldy); \
        else if (type == T_MXFP4) pz_dot_iq4_nl(g, gb, 1, x, xd, bs32, K, RR, ahead, out, ldy); \
        else if (type == T_Q6_K) pz_dot_q6_k(g, gb, x, xd, bs32, K, RR, ahead, out, ldy);      \
        else if (type == T_IQ4_XS) pz_dot_iq4_xs(g, gb, x, xd, bs32, K, RR, ahead, out, ldy);  \
        else pz_dot_q5_0(g, gb, hb, x, xd, bs32, K, RR, ahead, out, ldy);                      \
    } while (0)
    PK_BY_ROWS(R, LS_T);
#undef LS_T
    return 0;
#else
    ls_packed_tile(type, g, x, xd, bs32, K, R, ahead, out, ldy);
    return ls_packed_tile(type, g + gb, x, xd, bs32, K, R, ahead, out + PK_ROWS, ldy);
#endif
}

// whether ls_packed_tile2 takes two groups of `type` in one pass here (else it makes two
// ls_packed_tile calls)
int ls_packed_pairs(int type) { return pz_pairs(type); }

// whether K-quant `type` (packed: Q2_K, Q3_K, Q6_K, TQ2_0) takes ls_kbytes_task here, and its scratch bytes
int ls_kbytes_type(int type) { return kb_type(type); }
int64_t ls_kbytes_scratch(int64_t K, int64_t ng) { return kb_scratch_bytes(K, ng); }

#if defined(__AVX2__)
// bytes per 256 values of a type ls_kbytes_task takes (its rows' least length per block)
static int64_t kb_block_bytes(int type) {
    int64_t block;
    return type == T_Q2_K ? 84 : type == T_Q3_K ? 110 : type == T_Q5_K ? 176
           : type == T_Q6_K ? 210 : nl_block_bytes(type, &block);
}
#endif

// Output columns n0 .. n0 + 8 ng - 1 (y at the part's first column) of all M activation rows
// (xq, xd, bs16: quantized per 256) for a K-quant part read through decoded groups
// (packed_kb.h): the ng groups of 8 rows from row n0 (w: the file's rows at stride
// row_bytes, or packed Q2_K / Q3_K / Q6_K / TQ2_0 groups) decoded once into buf (ls_kbytes_scratch bytes, 64-byte
// aligned), then 4 activation rows at a time against pairs of them (one group at a time in
// AVX2 builds). Returns 0, -1 where this build has no such tiles (no AVX2), or -3 for sizes
// that do not fit (a type without these tiles, K not whole super-blocks, rows shorter than K
// values of the type, y rows closer than the task's columns).
int ls_kbytes_task(int type, int packed, const uint8_t *w, int64_t row_bytes, int64_t n0,
                   int64_t ng, int64_t K, const int8_t *xq, const float *xd, const int16_t *bs16,
                   int64_t M, float *y, int64_t ldy, uint8_t *buf) {
#if defined(__AVX2__)
    const int pq3 = type == T_Q3_K || type == T_Q2_K || type == T_TQ2_0;  // packed: packed_q3.h's
    if (!kb_type(type) || (packed && type != T_Q6_K && !pq3) || K < 256 || K % 256 != 0 || n0 < 0 ||
        ng < 0 || M < 0 || (M > 1 && ldy < n0 + PK_ROWS * ng) || !w || !xq || !xd || !bs16 ||
        !y || !buf || (!packed && row_bytes < K / 256 * kb_block_bytes(type)))
        return -3;
    const int64_t nb = K / 256, gb = nb * KB_SB;
    int8_t *q = (int8_t *)(buf + ng * gb);
    int16_t *sc = (int16_t *)(q + 8 * K), *mn = sc + K / 16 + 16;
    float *d = (float *)(mn + K / 16 + 16), *fs = d + 2 * (nb + 1);
    kprep_t kp = {sc, mn, d, d + nb + 1, q, 0};
    for (int64_t j = 0; j < ng; j++) {
        const uint8_t *g = w + (n0 + PK_ROWS * j) * row_bytes;
        if (packed && pq3) kb_group_q3p(g, type == T_TQ2_0 ? 2 : type == T_Q2_K, K, buf + j * gb);
        else if (packed) kb_group_q6p(g, K, buf + j * gb);
        else kb_group_rows(type, g, row_bytes, K, q, &kp, fs, fs + K / 16, buf + j * gb);
    }
    const int has_min = k_has_min(type);
#if PZ_PAIRS
    float tmp[4 * 16];
#endif
    for (int64_t m = 0; m < M; m += 4) {
        const int R = M - m < 4 ? (int)(M - m) : 4;
        const int8_t *x = xq + m * K;
        const float *xs = xd + m * nb;
        const int16_t *bs = bs16 + m * (K / 16);
        for (int64_t j = 0; j < ng; j += 1 + PZ_PAIRS) {
#if PZ_PAIRS
            const int two = j + 1 < ng;  // a last group alone: paired with itself, half kept
            float *out = two ? y + m * ldy + n0 + PK_ROWS * j : tmp;
            const int64_t ld = two ? ldy : 16, g2 = two ? gb : 0;
#define LS_T(RR)                                                                              \
    do {                                                                                      \
        if (has_min) kb_dot(buf + j * gb, g2, 1, x, xs, bs, K, RR, out, ld);                   \
        else kb_dot(buf + j * gb, g2, 0, x, xs, bs, K, RR, out, ld);                           \
    } while (0)
            PK_BY_ROWS(R, LS_T);
#undef LS_T
            if (!two)
                for (int r = 0; r < R; r++)
                    memcpy(y + (m + r) * ldy + n0 + PK_ROWS * j, tmp + 16 * r, sizeof(float) * PK_ROWS);
#else  // one group at a time in 256-bit vectors
            float *out = y + m * ldy + n0 + PK_ROWS * j;
#define LS_T(RR)                                                                              \
    do {                                                                                      \
        if (has_min) kb_dot8(buf + j * gb, 1, x, xs, bs, K, RR, out, ldy);                     \
        else kb_dot8(buf + j * gb, 0, x, xs, bs, K, RR, out, ldy);                             \
    } while (0)
            PK_BY_ROWS(R, LS_T);
#undef LS_T
#endif
        }
    }
    return 0;
#else
    (void)type, (void)packed, (void)w, (void)row_bytes, (void)n0, (void)ng, (void)K, (void)xq;
    (void)xd, (void)bs16, (void)M, (void)y, (void)ldy, (void)buf;
    return -1;
#endif
}

// group bytes of a packable type, 0 otherwise (for the Python side's allocation)
int64_t ls_packed_group_bytes(int type, int64_t K) { return packed_group_bytes(type, K); }

// Q4_K's 12 scale bytes from the 8 six-bit scales and mins (the inverse of k_scale_words)
static void q4_k_scale_bytes(const uint8_t *sc, const uint8_t *mn, uint8_t q[12]) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
}

// One group of 8 rows (src rows at stride row_bytes) <-> its packed bytes g; dir 1 packs.
static void pack_group(int type, uint8_t *rows, int64_t row_bytes, int64_t K, uint8_t *g,
                       int dir) {
#define LS_MOVE(packed, raw, n)                                                               \
    do {                                                                                      \
        if (dir) memcpy((packed), (raw), (n));                                                \
        else memcpy((raw), (packed), (n));                                                    \
    } while (0)
    if (type == T_IQ4_XS) {
        for (int64_t b = 0; b < K / 256; b++) pk_move_iq4_xs(rows, row_bytes, b, g, dir);
        return;
    }
    if (type == T_Q6_K) {
        pq6_group(rows, row_bytes, K, g, dir);
        return;
    }
    if (type == T_Q3_K) {
        pq3_group(rows, row_bytes, K, g, dir);
        return;
    }
    if (type == T_Q2_K || type == T_TQ2_0) {
        pq2_group(type == T_TQ2_0, rows, row_bytes, K, g, dir);
        return;
    }
    for (int r = 0; r < PK_ROWS; r++) {
        uint8_t *row = rows + r * row_bytes;
        if (type == T_Q8_0) {
            for (int64_t c = 0; c < K / 32; c++) {
                uint8_t *blk = g + 272 * c, *src = row + 34 * c;
                LS_MOVE(blk + 2 * r, src, 2);
                for (int t = 0; t < 8; t++) LS_MOVE(blk + 16 + 32 * t + 4 * r, src + 2 + 4 * t, 4);
            }
        } else if (type == T_Q5_0 || type == T_Q4_0 || type == T_IQ4_NL || type == T_Q5_1 ||
                   type == T_MXFP4) {
            // Q5_1: d, m, qh, qs in the row; d[8], m[8], hb, nibbles in the group. MXFP4:
            // e, qs in the row; e[8], nibbles in the group
            const int hb = type == T_Q5_0 || type == T_Q5_1, m1 = type == T_Q5_1, mx = type == T_MXFP4;
            const int bb = m1 ? 192 : hb ? 176 : mx ? 136 : 144, rb = m1 ? 24 : hb ? 22 : mx ? 17 : 18;
            for (int64_t c = 0; c < K / 32; c++) {
                uint8_t *blk = g + bb * c, *src = row + rb * c, *nib = blk + bb - 128;
                if (mx) LS_MOVE(blk + r, src, 1);
                else LS_MOVE(blk + 2 * r, src, 2);
                if (m1) LS_MOVE(blk + 16 + 2 * r, src + 2, 2);
                for (int u = 0; u < 4; u++) LS_MOVE(nib + 32 * u + 4 * r, src + rb - 16 + 4 * u, 4);
                if (!hb) continue;
                uint32_t qh = 0;  // bit j: the fifth bit of value j = 4t + i
                if (dir) memcpy(&qh, src + rb - 20, 4);
                for (int i = 0; i < 4; i++) {
                    uint8_t *hbyte = blk + bb - 160 + 4 * r + i;
                    if (dir) {
                        *hbyte = 0;
                        for (int t = 0; t < 8; t++) *hbyte |= (uint8_t)(((qh >> (4 * t + i)) & 1) << t);
                    } else {
                        for (int t = 0; t < 8; t++) qh |= (uint32_t)((*hbyte >> t) & 1) << (4 * t + i);
                    }
                }
                if (!dir) memcpy(src + rb - 20, &qh, 4);
            }
        } else {  // T_Q4_K, T_Q5_K (Q4_K's fields, qh[32] before the nibbles: packed_k.h)
            const int q5 = type == T_Q5_K, sb = q5 ? 1440 : 1184, rb = q5 ? 176 : 144;
            for (int64_t b = 0; b < K / 256; b++) {
                uint8_t *blk = g + sb * b, *src = row + rb * b, *qs = src + (q5 ? 48 : 16);
                LS_MOVE(blk + 2 * r, src, 2);
                LS_MOVE(blk + 16 + 2 * r, src + 2, 2);
                if (dir) {
                    uint32_t u[4];
                    k_scale_words(src + 4, u);
                    const uint8_t *s8 = (const uint8_t *)u;
                    for (int j = 0; j < 8; j++) {
                        blk[32 + 8 * j + r] = s8[j];
                        blk[96 + 8 * j + r] = s8[8 + j];
                    }
                } else {
                    uint8_t sc[8], mn[8];
                    for (int j = 0; j < 8; j++) {
                        sc[j] = blk[32 + 8 * j + r];
                        mn[j] = blk[96 + 8 * j + r];
                    }
                    q4_k_scale_bytes(sc, mn, src + 4);
                }
                for (int gp = 0; gp < 4; gp++)
                    for (int t = 0; t < 8; t++)
                        LS_MOVE(blk + 160 + 256 * gp + 32 * t + 4 * r, qs + 32 * gp + 4 * t, 4);
                if (!q5) continue;
                // value 32 j + l's fifth bit: bit j of qh[l] <-> bit l / 4 of byte 4 r + l % 4
                // of sub-block j's hb
                for (int j = 0; j < 8; j++)
                    for (int i = 0; i < 4; i++) {
                        uint8_t *hbyte = blk + 1184 + 32 * j + 4 * r + i;
                        if (dir) *hbyte = 0;
                        for (int t = 0; t < 8; t++) {
                            uint8_t *qh = src + 16 + 4 * t + i;
                            if (dir) *hbyte |= (uint8_t)(((*qh >> j) & 1) << t);
                            else *qh = (uint8_t)((*qh & ~(1u << j)) | (((*hbyte >> t) & 1u) << j));
                        }
                    }
            }
        }
    }
#undef LS_MOVE
}

// rows [N, row_bytes] of `type` -> packed [N / 8][group bytes] (dir 1), or back (dir 0).
// Returns 0, or -1 when the type is not packable or N is not whole groups.
int ls_repack(int type, uint8_t *rows, int64_t N, int64_t K, int64_t row_bytes, uint8_t *packed,
              int dir, int nthreads) {
    const int64_t gb = packed_group_bytes(type, K);
    if (gb == 0 || N % PK_ROWS != 0 || K % packed_block(type) != 0) return -1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t g = 0; g < N / PK_ROWS; g++)
        pack_group(type, rows + g * PK_ROWS * row_bytes, row_bytes, K, packed + g * gb, dir);
    return 0;
}
