// The K-quant kernels on two packed groups at once (packed_z.h's idea and numbers): Q4_K
// and Q5_K (packed_k.h's layouts), Q6_K (packed_q6.h) and IQ4_XS (packed_xs.h), 16 weight rows in
// the lanes of 512-bit vectors, each lane with the integer sums and float steps of the
// one-group kernels.

#pragma once

#include "packed_k.h"
#include "packed_q6.h"
#include "packed_xs.h"
#include "packed_z.h"

#if PZ_PAIRS
// the 8 bytes at a then the 8 at b, zero-extended to 16 int32 lanes
static inline __m512i pz_u8x16(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                                   _mm_loadl_epi64((const __m128i *)b)));
}

// pk_dot_q4_k's VNNI steps (packed_k.h: Q4_K q5 0, Q5_K q5 1) on groups g and g + gb:
// y[r * ldy + 0..15] for the R (1..4, compile-time) activation rows x [R, K] quantized per
// 256 (xd [R, K/256], bs32 [R, K/32]).
static inline __attribute__((always_inline)) void pz_dot_q4_k(
    const uint8_t *g, int64_t gb, int q5, const int8_t *x, const float *xd, const int16_t *bs32,
    int64_t K, int R, int ahead, float *y, int64_t ldy) {
    const int64_t nb = K / 256, sb = PK_K_BYTES(q5);
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    (void)b4;  // Q5_K's fifth bits only
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g + sb * b, *b1 = b0 + gb;
        const int8_t *xb = x + 256 * b;
        __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
        for (int gp = 0; gp < 4; gp++) {
            __m512i l0 = _mm512_setzero_si512(), l1 = l0, l2 = l0, l3 = l0;
            __m512i h0 = l0, h1 = l0, h2 = l0, h3 = l0;
            const uint8_t *n0 = b0 + 160 + 256 * gp, *n1 = b1 + 160 + 256 * gp;
            const __m512i hl = q5 ? pz_load2(b0 + 1184 + 64 * gp, b1 + 1184 + 64 * gp) : l0;
            const __m512i hh = q5 ? pz_load2(b0 + 1216 + 64 * gp, b1 + 1216 + 64 * gp) : l0;
#define LS_PR(r, lo, hi)                                                                      \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 64 * gp + 4 * t;                                     \
        lo = _mm512_dpbusd_epi32(lo, wl, pz_bcast4(xr));                                       \
        hi = _mm512_dpbusd_epi32(hi, wh, pz_bcast4(xr + 32));                                  \
    } while (0)
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                if (ahead && !(t & 1)) {  // the next pair in its byte order (PK_AHEAD)
                    const uint8_t *pf = g + 2 * gb + 2 * sb * b + (sb / 2) * gp + (sb / 16) * t;
                    PK_AHEAD(pf), PK_AHEAD(pf + 64), PK_AHEAD(pf + 128);
                }
                const __m512i v = pz_load2(n0 + 32 * t, n1 + 32 * t);
                __m512i wl = _mm512_and_si512(v, lo4);
                __m512i wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                if (q5) {  // bit t of each byte to bit 4 (packed_k.h)
                    wl = _mm512_or_si512(wl, _mm512_and_si512(t <= 4 ? _mm512_slli_epi16(hl, 4 - t)
                                                                      : _mm512_srli_epi16(hl, t - 4), b4));
                    wh = _mm512_or_si512(wh, _mm512_and_si512(t <= 4 ? _mm512_slli_epi16(hh, 4 - t)
                                                                      : _mm512_srli_epi16(hh, t - 4), b4));
                }
                LS_PR(0, l0, h0);
                if (R > 1) LS_PR(1, l1, h1);
                if (R > 2) LS_PR(2, l2, h2);
                if (R > 3) LS_PR(3, l3, h3);
            }
#undef LS_PR
            // the 32-bit sums times each row's scale (one per lane)
            const __m512i sl = pz_u8x16(b0 + 32 + 16 * gp, b1 + 32 + 16 * gp);
            const __m512i sh = pz_u8x16(b0 + 40 + 16 * gp, b1 + 40 + 16 * gp);
#define LS_PS(lo, hi, acc)                                                                    \
    acc = _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_mullo_epi32(lo, sl), _mm512_mullo_epi32(hi, sh)))
            LS_PS(l0, h0, i0);
            if (R > 1) LS_PS(l1, h1, i1);
            if (R > 2) LS_PS(l2, h2, i2);
            if (R > 3) LS_PS(l3, h3, i3);
#undef LS_PS
        }
        // sum_j mn_j * bs32_j: pairs of sub-blocks (mn_2i, mn_2i+1) per row lane
        __m512i mp[4];
        for (int i = 0; i < 4; i++)
            mp[i] = _mm512_or_si512(pz_u8x16(b0 + 96 + 16 * i, b1 + 96 + 16 * i),
                                    _mm512_slli_epi32(pz_u8x16(b0 + 104 + 16 * i, b1 + 104 + 16 * i), 16));
        const __m512 d = pz_halves16(b0, b1), dm = pz_halves16(b0 + 16, b1 + 16);
#define LS_PF(r, acc, yy)                                                                     \
    PK_SB_END(512, acc, yy, mp, 4, bs32 + (r) * (K / 32) + 8 * b, 0, 1, d, dm, xd[(r) * nb + b])
        PZ_EACH(LS_PF);
#undef LS_PF
    }
    PZ_STORE(y, ldy);
}

// the 8 bytes at a then the 8 at b, sign-extended to 16 int32 lanes
static inline __m512i pz_i8x16(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                                   _mm_loadl_epi64((const __m128i *)b)));
}

// pq6_dot's steps (packed_q6.h) on groups g and g + gb: y[r * ldy + 0..15] for the R (1..4)
// activation rows x [R, K] quantized per 256 (xd [R, K/256], bs16 [R, K/16]).
static inline __attribute__((always_inline)) void pz_dot_q6_k(
    const uint8_t *g, int64_t gb, const int8_t *x, const float *xd, const int16_t *bs16,
    int64_t K, int R, int ahead, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), h2 = _mm512_set1_epi8(0x30);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g + PQ6_SB * b, *b1 = b0 + gb;
        const int8_t *xb = x + 256 * b;
        __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
        for (int j = 0; j < 16; j++) {
            const uint8_t *s0 = b0 + 144 + 96 * j, *s1 = b1 + 144 + 96 * j;
            if (ahead) {  // the next pair in its byte order (packed.h's PK_AHEAD)
                const uint8_t *pf = g + 2 * gb + 2 * (s0 - g);
                PK_AHEAD(pf), PK_AHEAD(pf + 64), PK_AHEAD(pf + 128);
            }
            const __m512i n0 = pz_load2(s0, s1), n1 = pz_load2(s0 + 32, s1 + 32);
            const __m512i hv = pz_load2(s0 + 64, s1 + 64);
            const __m512i w0 = _mm512_or_si512(_mm512_and_si512(n0, lo4),
                                               _mm512_and_si512(_mm512_slli_epi16(hv, 4), h2));
            const __m512i w1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n0, 4), lo4),
                                               _mm512_and_si512(_mm512_slli_epi16(hv, 2), h2));
            const __m512i w2 = _mm512_or_si512(_mm512_and_si512(n1, lo4), _mm512_and_si512(hv, h2));
            const __m512i w3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n1, 4), lo4),
                                               _mm512_and_si512(_mm512_srli_epi16(hv, 2), h2));
            const __m512i s32 = pz_i8x16(b0 + 16 + 8 * j, b1 + 16 + 8 * j);
            const __m512i sp = PK_PAIRS16(512, s32, s32);
#define LS_PR(r, acc, yy) PK_SUB16(512, acc, w0, w1, w2, w3, xb + (r) * K + 16 * j, sp)
            PZ_EACH(LS_PR);
#undef LS_PR
        }
        // 32 * sum_j sc_j * bs16_j per row lane: sub-block pairs (sc_2k, sc_2k+1)
        __m512i mp[8];
        for (int k = 0; k < 8; k++) {
            const __m512i lo = pz_i8x16(b0 + 16 + 16 * k, b1 + 16 + 16 * k);
            const __m512i hi = pz_i8x16(b0 + 24 + 16 * k, b1 + 24 + 16 * k);
            mp[k] = PK_PAIRS16(512, lo, hi);
        }
        const __m512 d = pz_halves16(b0, b1);
#define LS_PF(r, acc, yy)                                                                     \
    PK_SB_END(512, acc, yy, mp, 8, bs16 + (r) * (K / 16) + 16 * b, 5, 0, d, d, xd[(r) * nb + b])
        PZ_EACH(LS_PF);
#undef LS_PF
    }
    PZ_STORE(y, ldy);
}

// pk_dot_iq4_xs's VNNI steps (packed_xs.h) on groups g and g + gb: y[r * ldy + 0..15] for
// the R (1..4) activation rows x [R, K] quantized per 256 (xd [R, K/256], bs32 [R, K/32]).
static inline __attribute__((always_inline)) void pz_dot_iq4_xs(
    const uint8_t *g, int64_t gb, const int8_t *x, const float *xd, const int16_t *bs32,
    int64_t K, int R, int ahead, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __m512i kv = _mm512_broadcast_i32x4(
        _mm_add_epi8(_mm_loadu_si128((const __m128i *)KV_IQ4NL), _mm_set1_epi8((char)0x80)));
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g + PK_XS_BYTES * b, *b1 = b0 + gb;
        const int8_t *xb = x + 256 * b;
        __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *n0 = b0 + 80 + 128 * j, *n1 = b1 + 80 + 128 * j;
            const __m512i sc = pz_i8x16(b0 + 16 + 8 * j, b1 + 16 + 8 * j);
            __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
#define LS_PR(r, acc, s)                                                                      \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 32 * j + 4 * t;                                      \
        s = _mm512_dpbusd_epi32(s, wl, pz_bcast4(xr));                                         \
        s = _mm512_dpbusd_epi32(s, wh, pz_bcast4(xr + 16));                                    \
    } while (0)
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                if (ahead) PREFETCH(n0 + 32 * t), PREFETCH(n1 + 32 * t);
                const __m512i v = pz_load2(n0 + 32 * t, n1 + 32 * t);
                const __m512i wl = _mm512_shuffle_epi8(kv, _mm512_and_si512(v, lo4));
                const __m512i wh = _mm512_shuffle_epi8(kv, _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4));
                LS_PR(0, i0, s0);
                if (R > 1) LS_PR(1, i1, s1);
                if (R > 2) LS_PR(2, i2, s2);
                if (R > 3) LS_PR(3, i3, s3);
            }
#undef LS_PR
#define LS_PS(r, acc, s)                                                                      \
    acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(_mm512_sub_epi32(                           \
              s, _mm512_set1_epi32(128 * bs32[(r) * (K / 32) + 8 * b + j])), sc))
            LS_PS(0, i0, s0);
            if (R > 1) LS_PS(1, i1, s1);
            if (R > 2) LS_PS(2, i2, s2);
            if (R > 3) LS_PS(3, i3, s3);
#undef LS_PS
        }
        const __m512 d = pz_halves16(b0, b1);
#define LS_PF(r, acc, yy)                                                                     \
    yy = _mm512_add_ps(yy, _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(xd[(r) * nb + b])),   \
                                         _mm512_cvtepi32_ps(acc)))
        PZ_EACH(LS_PF);
#undef LS_PF
    }
    PZ_STORE(y, ldy);
}
#endif
