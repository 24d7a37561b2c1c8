// Prompt-sized matmuls (M >= ROWS_MIN_M) of the packed 32-value-block types -- Q4_0, Q5_0,
// Q5_1, Q8_0, IQ4_NL, MXFP4 -- on AVX-512 builds: each task decodes its pairs of packed
// groups once into plain unsigned bytes, as packed_z.h's tiles form them in every pass (a
// 512-bit vector: 4 values of group g's 8 rows, then of group g + 1's), with the two groups'
// block scales as 16 floats, and every tile of 4 activation rows then reads them with a load
// and dpbusd alone. In place, the nibbles, fifth bits and table lookups cost ~40 operations a
// block and pair for 32 dpbusd, redone for every 4 activation rows (Gemma 270M's Q5_0 gate
// at 512 rows ran at ~190 GMAC/s, its Q4_K, whose nibbles cost 3, at ~275).
//
// Numbers: per (row, block), the unsigned values u = q + o (o: zb_offset) against the int8
// activations (dpbusd, exact), summed from -o * sum(x) on, in two chains of 4 steps added
// together: the integer packed_z.h's tiles form (u summed, then o * sum(x) off), exactly;
// then its float steps, y = cvt(isum) * (dw * dx) + y [; Q5_1: y = m * (dx * sum(x)) + y],
// fused as there. So every output has the bits of the packed tiles (and of the AVX2 build's
// and the file layout's), whatever M, the tile or the pairing.
//
// Decoded layout, per pair of groups, per block of 32 values, zb_block_bytes:
//   u8 v[8 steps t][2 groups][8 rows][4] (values 4t .. 4t + 3) | float dw[16] | (Q5_1) float m[16]

#pragma once

#include "packed_z.h"

#if PZ_PAIRS
// the offset o that makes a type's values unsigned (u = q + o)
static inline int zb_offset(int type) {
    return type == T_Q5_0 ? 16 : type == T_Q4_0 ? 8 : type == T_Q5_1 ? 0 : 128;
}

static inline int64_t zb_block_bytes(int type) { return type == T_Q5_1 ? 640 : 576; }

// One pair of packed groups (b0, b0 + gb) decoded into out: nc blocks of zb_block_bytes.
static void zb_decode(int type, const uint8_t *g, int64_t gb, int64_t nc, uint8_t *out) {
    const int hb = type == T_Q5_1 ? 2 : type == T_Q5_0, mx = type == T_MXFP4;
    const int nl = type == T_IQ4_NL || mx, q8 = type == T_Q8_0;
    const int64_t bb = q8 ? 272 : nl ? PK_NL_BYTES(mx) : hb == 2 ? 192 : hb ? 176 : 144;
    const int64_t hoff = hb == 2 ? 32 : 16, noff = bb - 128, ob = zb_block_bytes(type);
    const __m512i lo4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const __m512i kv = _mm512_broadcast_i32x4(_mm_add_epi8(
        _mm_loadu_si128((const __m128i *)(mx ? KV_MXFP4 : KV_IQ4NL)), _mm_set1_epi8((char)0x80)));
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *b0 = g + bb * c, *b1 = b0 + gb;
        uint8_t *o = out + ob * c;
        const __m512i h = hb ? pz_load2(b0 + hoff, b1 + hoff) : _mm512_setzero_si512();
        for (int t = 0; t < 8; t++) {
            __m512i w;
            if (q8) {  // int8 values + 128
                w = _mm512_xor_si512(pz_load2(b0 + 16 + 32 * t, b1 + 16 + 32 * t), _mm512_set1_epi8((char)0x80));
            } else {
                const __m512i v = pz_load2(b0 + noff + 32 * (t & 3), b1 + noff + 32 * (t & 3));
                w = t < 4 ? _mm512_and_si512(v, lo4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                if (nl) w = _mm512_shuffle_epi8(kv, w);
                if (hb)  // bit t of each byte to bit 4 (pz_dot_q5_0)
                    w = _mm512_or_si512(w, _mm512_and_si512(t <= 4 ? _mm512_slli_epi16(h, 4 - t)
                                                                    : _mm512_srli_epi16(h, t - 4), b4));
            }
            _mm512_storeu_si512(o + 64 * t, w);
        }
        _mm512_storeu_ps((float *)(o + 512), mx ? pz_e8m0x16(b0, b1) : pz_halves16(b0, b1));
        if (hb == 2) _mm512_storeu_ps((float *)(o + 576), pz_halves16(b0 + 16, b1 + 16));
    }
}

// The decoded pair d (nc = K / 32 blocks of ob bytes) against R (1..4, compile-time)
// activation rows x [R, K] with block scales xd [R, K/32] and sums bs [R, K/32]:
// y[r * ldy + 0..15]. o: zb_offset; m1: Q5_1's offsets m follow.
static inline __attribute__((always_inline)) void zb_dot(
    const uint8_t *d, int64_t ob, int o, int m1, const int8_t *x, const float *xd,
    const int16_t *bs, int64_t K, int R, float *y, int64_t ldy) {
    const int64_t nc = K / 32;
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *blk = d + ob * c;
        __m512i i0 = _mm512_set1_epi32(-o * bs[c]), i1 = i0, i2 = i0, i3 = i0;
        if (R > 1) i1 = _mm512_set1_epi32(-o * bs[nc + c]);
        if (R > 2) i2 = _mm512_set1_epi32(-o * bs[2 * nc + c]);
        if (R > 3) i3 = _mm512_set1_epi32(-o * bs[3 * nc + c]);
        __m512i j0 = _mm512_setzero_si512(), j1 = j0, j2 = j0, j3 = j0;  // the odd steps
#define LS_PR(r, acc, yy)                                                                     \
    do {                                                                                      \
        const __m512i xb = pz_bcast4(x + (r) * K + 32 * c + 4 * t);                             \
        if (t & 1) j##r = _mm512_dpbusd_epi32(j##r, w, xb);                                    \
        else acc = _mm512_dpbusd_epi32(acc, w, xb);                                           \
    } while (0)
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m512i w = _mm512_loadu_si512(blk + 64 * t);
            PZ_EACH(LS_PR);
        }
#undef LS_PR
        const __m512 dw = _mm512_loadu_ps((const float *)(blk + 512));
#define LS_PF(r, acc, yy)                                                                     \
    yy = pz_madd16(_mm512_cvtepi32_ps(_mm512_add_epi32(acc, j##r)),                            \
                   _mm512_mul_ps(dw, _mm512_set1_ps(xd[(r) * nc + c])), yy)
        PZ_EACH(LS_PF);
#undef LS_PF
        if (m1) {  // the offsets m: y = m * (dx * sum(x)) + y
            const __m512 mw = _mm512_loadu_ps((const float *)(blk + 576));
#define LS_PM(r, acc, yy) yy = pz_madd16(mw, _mm512_set1_ps(xd[(r) * nc + c] * (float)bs[(r) * nc + c]), yy)
            PZ_EACH(LS_PM);
#undef LS_PM
        }
    }
    PZ_STORE(y, ldy);
}
#endif

// whether packed `type` takes ls_zbytes_task here
static inline int zb_type(int type) {
    return PZ_PAIRS && (type == T_Q5_0 || type == T_Q4_0 || type == T_Q5_1 || type == T_Q8_0 ||
                        type == T_IQ4_NL || type == T_MXFP4);
}

// Bytes of scratch ls_zbytes_task needs for ng groups of K values.
static inline int64_t zb_scratch_bytes(int64_t K, int64_t ng) { return (ng + 1) / 2 * (K / 32) * 640; }

// (packed.c's unit, for qparts.h) whether packed `type` takes ls_zbytes_task here, and its
// scratch bytes
int ls_zbytes_type(int type) { return zb_type(type); }
int64_t ls_zbytes_scratch(int64_t K, int64_t ng) { return zb_scratch_bytes(K, ng); }

// Output columns n0 .. n0 + 8 ng - 1 (y at the part's first column) of all M activation rows
// (xq, xd, bs: quantized per 32) for a packed part of `type` (zb_type) whose groups start at
// w: the ng groups from row n0 decoded in pairs once into buf (ls_zbytes_scratch bytes, 64-byte
// aligned), then 4 activation rows at a time against each pair. Returns 0, -1 where this
// build has no such tiles, or -3 for sizes that do not fit.
int ls_zbytes_task(int type, const uint8_t *w, int64_t n0, int64_t ng, int64_t K,
                   const int8_t *xq, const float *xd, const int16_t *bs, int64_t M, float *y,
                   int64_t ldy, uint8_t *buf) {
#if PZ_PAIRS
    if (!zb_type(type) || K < 32 || K % 32 != 0 || n0 < 0 || n0 % PK_ROWS || ng < 1 || M < 0 ||
        (M > 1 && ldy < n0 + PK_ROWS * ng) || !w || !xq || !xd || !bs || !y || !buf)
        return -3;
    const int64_t nc = K / 32, gb = packed_group_bytes(type, K), ob = zb_block_bytes(type);
    const int64_t pb = nc * ob, np = (ng + 1) / 2;
    for (int64_t j = 0; j < np; j++) {  // a last group alone: paired with itself, half kept
        const uint8_t *g = w + (n0 / PK_ROWS + 2 * j) * gb;
        zb_decode(type, g, 2 * j + 1 < ng ? gb : 0, nc, buf + j * pb);
    }
    const int o = zb_offset(type), m1 = type == T_Q5_1;
    float tmp[4 * 16];
    for (int64_t m = 0; m < M; m += 4) {
        const int R = M - m < 4 ? (int)(M - m) : 4;
        const int8_t *x = xq + m * K;
        const float *xs = xd + m * nc;
        const int16_t *s = bs + m * nc;
        for (int64_t j = 0; j < np; j++) {
            const int two = 2 * j + 1 < ng;
            float *out = two ? y + m * ldy + n0 + 2 * PK_ROWS * j : tmp;
            const int64_t ld = two ? ldy : 16;
#define LS_T(RR)                                                                              \
    do {                                                                                      \
        if (m1) zb_dot(buf + j * pb, ob, 0, 1, x, xs, s, K, RR, out, ld);                     \
        else zb_dot(buf + j * pb, ob, o, 0, x, xs, s, K, RR, out, ld);                        \
    } while (0)
            PK_BY_ROWS(R, LS_T);
#undef LS_T
            if (!two)
                for (int r = 0; r < R; r++)
                    memcpy(y + (m + r) * ldy + n0 + 2 * PK_ROWS * j, tmp + 16 * r, sizeof(float) * PK_ROWS);
        }
    }
    return 0;
#else
    (void)type, (void)w, (void)n0, (void)ng, (void)K, (void)xq, (void)xd, (void)bs, (void)M;
    (void)y, (void)ldy, (void)buf;
    return -1;
#endif
}
