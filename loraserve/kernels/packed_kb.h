// Prompt-sized matmuls (M >= ROWS_MIN_M) of the K-quants with 16-value sub-blocks -- Q2_K,
// Q5_K in the file's layout, Q2_K, Q3_K, TQ2_0 and Q6_K in theirs or packed (packed_q3.h,
// packed_q6.h) -- and of the grid and
// ternary types (IQ2_*, IQ3_*, IQ1_*, TQ*: their scalar grid decode once per task instead of
// once per row and call, kb_offset making their values unsigned): each task decodes its
// groups of 8 weight rows once into plain bytes laid out as packed.h lays out values (a
// vector's lanes are 8 rows, 4 values each), and every tile of 4 activation rows then reads
// them with dpbusd alone, two groups in a 512-bit vector (packed_z.h) on AVX-512 builds, or
// one group with maddubs and madd on AVX2 (kb_dot8). In its own layout a row decoded its
// values again for each 4 activation rows (Q3_K's 3-bit values: ~8 instructions per 32
// values, more than its products).
//
// Numbers: per (row, super-block), the stored values u >= 0 (Q3_K: q + 4, Q6_K: q + 32,
// else q) times the activations per 16-value sub-block j (dpbusd: exact), times the int
// scale sc_j, summed; then o * sum_j sc_j * bs16_j comes off (o the offset of u), or the
// types with a minimum form msum = sum_j mn_j * bs16_j -- the integers of kquant.h, exactly
// -- and kquant.h's float steps, y = y + (d_b * xd_b) * isum_b [; y = y - (dm_b * xd_b) *
// msum_b]. So every output has the bits of the row read in its own layout, whatever M, the
// tile or the pairing.
//
// Decoded layout, per group of 8 rows, per super-block, KB_SB bytes:
//   float d[8] | float dm[8] | int32 sc[16 j][8 rows] |
//   int32 mp[8 k][8 rows] (int16 pairs: o * sc or mn of sub-blocks 2k, 2k + 1) |
//   u8 v[64 steps s][8 rows][4] (values 4s .. 4s + 3)

#pragma once

#include "kprep.h"
#include "packed_q3.h"
#include "packed_zk.h"
#include "quant_chunk.h"

#define KB_SB 2880
#define KB_DM 32
#define KB_SC 64
#define KB_MP 576
#define KB_V 832

// The offset o that makes a type's int8 values q non-negative (u = q + o; 0: they are):
// Q6_K 32, Q3_K 4, and the grid types' largest |q| (quant_iq.h: IQ2_* grid bytes up to 43,
// IQ3_XXS 62, IQ3_S 15, IQ1_* 8 g +- 1 up to 9), TQ*'s 1
static inline int kb_offset(int type) {
    switch (type) {
    case T_Q6_K: return 32;
    case T_Q3_K: return 4;
    case T_IQ2_XXS: case T_IQ2_XS: case T_IQ2_S: return 43;
    case T_IQ3_XXS: return 62;
    case T_IQ3_S: return 15;
    case T_IQ1_S: case T_IQ1_M: return 9;
    case T_TQ1_0: case T_TQ2_0: return 1;
    default: return 0;
    }
}

// whether `type` (a ggml type; Q6_K also packed) takes the decoded tiles here: the K-quants
// with 16-value sub-blocks, the grid and ternary types; on AVX2 (kb_dot8's int16 sums of
// two steps) only those whose u stays <= 63, on AVX-512 (dpbusd) all of them
static inline int kb_type(int type) {
#if defined(__AVX2__)
    const int any = type == T_Q2_K || type == T_Q3_K || type == T_Q5_K || type == T_Q6_K ||
                    (is_nl_kform(type) && type != T_IQ4_XS);
    return any && (PZ_PAIRS || type == T_Q6_K || 2 * kb_offset(type) <= 63);
#else
    (void)type;
    return 0;
#endif
}

#if defined(__AVX2__)
// 8 rows' 32 values (row r at q + r * K) into 8 steps of [8 rows][4] (a 32-bit transpose)
static inline void kb_transpose(const int8_t *q, int64_t K, __m256i add, uint8_t *out) {
    __m256i r[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_add_epi8(_mm256_loadu_si256((const __m256i *)(q + i * K)), add);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_si256((__m256i *)(out + 32 * i), _mm256_permute2x128_si256(u[i], u[i + 4], 0x20));
        _mm256_storeu_si256((__m256i *)(out + 32 * (i + 4)), _mm256_permute2x128_si256(u[i], u[i + 4], 0x31));
    }
}

// One group of 8 file rows (stride row_bytes) decoded into db; q: 8 K bytes, kp: one row's
// scales (its q unused), fs / fm: K / 16 floats each for the unpackers' float scales.
static void kb_group_rows(int type, const uint8_t *rows, int64_t row_bytes, int64_t K,
                          int8_t *q, kprep_t *kp, float *fs, float *fm, uint8_t *db) {
    const int64_t nb = K / 256;
    const int o = kb_offset(type);
    for (int r = 0; r < PK_ROWS; r++) {
        const uint8_t *row = rows + r * row_bytes;
        kp->q = q + r * K;
        if (type == T_Q6_K) decode_values(T_Q6_K, row, K, kp->q);  // u = q + 32
        k_prepare(type, row, K, kp, type != T_Q6_K, fs, fm);  // Q6_K: its scales only
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *out = db + KB_SB * b;
            ((float *)out)[r] = kp->d[b];
            ((float *)(out + KB_DM))[r] = kp->dm[b];
            for (int j = 0; j < 16; j++) {
                const int16_t sc = kp->sc[16 * b + j];
                ((int32_t *)(out + KB_SC))[8 * j + r] = sc;
                ((int16_t *)(out + KB_MP))[2 * (8 * (j / 2) + r) + j % 2] =
                    o ? (int16_t)(o * sc) : kp->mn[16 * b + j];
            }
        }
    }
    const __m256i add = _mm256_set1_epi8((char)(type == T_Q6_K ? 0 : o));  // u = q + o
    for (int64_t b = 0; b < nb; b++)
        for (int c = 0; c < 8; c++)
            kb_transpose(q + 256 * b + 32 * c, K, add, db + KB_SB * b + KB_V + 256 * c);
}

// One packed Q6_K group (packed_q6.h) decoded into db: its steps as pq6_dot forms them.
static void kb_group_q6p(const uint8_t *g, int64_t K, uint8_t *db) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), h2 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < K / 256; b++) {
        const uint8_t *blk = g + PQ6_SB * b;
        uint8_t *out = db + KB_SB * b;
        _mm256_storeu_ps((float *)out, pk_halves8(blk));
        for (int j = 0; j < 16; j++) {
            _mm256_storeu_si256((__m256i *)(out + KB_SC + 32 * j),
                                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 8 * j))));
            const uint8_t *sb = blk + 144 + 96 * j;
            const __m256i n0 = _mm256_loadu_si256((const __m256i *)sb);
            const __m256i n1 = _mm256_loadu_si256((const __m256i *)(sb + 32));
            const __m256i hv = _mm256_loadu_si256((const __m256i *)(sb + 64));
            __m256i *v = (__m256i *)(out + KB_V + 128 * j);
            _mm256_storeu_si256(v, _mm256_or_si256(_mm256_and_si256(n0, lo4),
                                                   _mm256_and_si256(_mm256_slli_epi16(hv, 4), h2)));
            _mm256_storeu_si256(v + 1, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), lo4),
                                                       _mm256_and_si256(_mm256_slli_epi16(hv, 2), h2)));
            _mm256_storeu_si256(v + 2, _mm256_or_si256(_mm256_and_si256(n1, lo4), _mm256_and_si256(hv, h2)));
            _mm256_storeu_si256(v + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), lo4),
                                                       _mm256_and_si256(_mm256_srli_epi16(hv, 2), h2)));
        }
        for (int k = 0; k < 8; k++) {  // 32 * sc of sub-blocks 2k, 2k + 1 as int16 pairs
            const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 16 * k)));
            const __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 24 + 16 * k)));
            _mm256_storeu_si256((__m256i *)(out + KB_MP + 32 * k),
                                PK_PAIRS16(256, _mm256_slli_epi32(lo, 5), _mm256_slli_epi32(hi, 5)));
        }
    }
}

// One packed Q3_K (q2 0), Q2_K (q2 1) or TQ2_0 (q2 2) group (packed_q3.h) decoded into db: its steps as
// pq3_dot forms them.
static void kb_group_q3p(const uint8_t *g, int q2, int64_t K, uint8_t *db) {
    const __m256i m3 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);
    for (int64_t b = 0; b < K / 256; b++) {
        const uint8_t *blk = g + PQ_SB(q2) * b, *scb = blk + (q2 == 1 ? 32 : 16);
        uint8_t *out = db + KB_SB * b;
        _mm256_storeu_ps((float *)out, pk_halves8(blk));
        if (q2 == 1) _mm256_storeu_ps((float *)(out + KB_DM), pk_halves8(blk + 16));
        for (int j = 0; j < 16; j++) {
            const __m128i s8 = _mm_loadl_epi64((const __m128i *)(scb + 8 * j));
            _mm256_storeu_si256((__m256i *)(out + KB_SC + 32 * j),
                                q2 == 2 ? _mm256_set1_epi32(1)
                                : q2 ? _mm256_and_si256(_mm256_cvtepu8_epi32(s8), _mm256_set1_epi32(15))
                                   : _mm256_cvtepi8_epi32(s8));
            const uint8_t *sb = q2 == 2 ? blk + 16 + 32 * j : q2 ? blk + 160 + 32 * j : blk + 144 + 96 * (j / 2);
            const int k = j & 1;
            const __m256i q = _mm256_loadu_si256((const __m256i *)(sb + (q2 ? 0 : 32 * k)));
            const __m256i hv = q2 ? q : _mm256_loadu_si256((const __m256i *)(sb + 64));
            __m256i *v = (__m256i *)(out + KB_V + 128 * j);
            for (int st = 0; st < 4; st++) {  // (Q3_K) bit 4k + st of hv to bit 2 (packed_q3.h)
                const int hs = 4 * k + st - 2;
                const __m256i h = hs <= 0 ? _mm256_sll_epi16(hv, _mm_cvtsi32_si128(-hs))
                                          : _mm256_srl_epi16(hv, _mm_cvtsi32_si128(hs));
                const __m256i u = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * st)), m3);
                _mm256_storeu_si256(v + st, q2 ? u : _mm256_or_si256(u, _mm256_and_si256(h, b2)));
            }
        }
        for (int k = 0; k < 8; k++) {  // Q3_K: 4 * sc, Q2_K: mn of sub-blocks 2k, 2k + 1 as int16 pairs
            const __m128i l8 = _mm_loadl_epi64((const __m128i *)(scb + 16 * k));
            const __m128i h8 = _mm_loadl_epi64((const __m128i *)(scb + 16 * k + 8));
            const __m256i lo = q2 ? _mm256_srli_epi32(_mm256_cvtepu8_epi32(l8), 4)
                                  : _mm256_slli_epi32(_mm256_cvtepi8_epi32(l8), 2);
            const __m256i hi = q2 ? _mm256_srli_epi32(_mm256_cvtepu8_epi32(h8), 4)
                                  : _mm256_slli_epi32(_mm256_cvtepi8_epi32(h8), 2);
            _mm256_storeu_si256((__m256i *)(out + KB_MP + 32 * k),
                                q2 == 2 ? _mm256_set1_epi32(0x00010001)  // TQ2_0: 1 * sc, sc 1
                                        : PK_PAIRS16(256, lo, hi));
        }
    }
}

// Decoded group g against R (1..4, compile-time) activation rows (kb_dot's arguments) on
// AVX2: y[r * ldy + 0..7]. A sub-block's 4 steps: maddubs products (u <= 63, |x| <= 128:
// two steps' int16 sums at most 32256, exact), then madd with its scale in int16 pairs;
// the integers and float steps of kb_dot.
static inline __attribute__((always_inline)) void kb_dot8(
    const uint8_t *g, int mn, const int8_t *x, const float *xd, const int16_t *bs16, int64_t K,
    int R, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g + KB_SB * b;
        const int8_t *xb = x + 256 * b;
        __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
        for (int j = 0; j < 16; j++) {
            const __m256i *v = (const __m256i *)(b0 + KB_V + 128 * j);
            const __m256i w0 = _mm256_loadu_si256(v), w1 = _mm256_loadu_si256(v + 1);
            const __m256i w2 = _mm256_loadu_si256(v + 2), w3 = _mm256_loadu_si256(v + 3);
            const __m256i s32 = _mm256_loadu_si256((const __m256i *)(b0 + KB_SC + 32 * j));
            const __m256i sp = PK_PAIRS16(256, s32, s32);
#define LS_PR(r, acc, yy) PK_SUB16(256, acc, w0, w1, w2, w3, xb + (r) * K + 16 * j, sp)
            PK_EACH(LS_PR, i, y);
#undef LS_PR
        }
        __m256i mp[8];
        for (int k = 0; k < 8; k++) mp[k] = _mm256_loadu_si256((const __m256i *)(b0 + KB_MP + 32 * k));
        const __m256 d = _mm256_loadu_ps((const float *)b0);
        const __m256 dm = _mm256_loadu_ps((const float *)(b0 + KB_DM));
#define LS_PF(r, acc, yy)                                                                     \
    PK_SB_END(256, acc, yy, mp, 8, bs16 + (r) * (K / 16) + 16 * b, 0, mn, d, dm, xd[(r) * nb + b])
        PK_EACH(LS_PF, i, y);
#undef LS_PF
    }
    pk_store(y, ldy, R, y0, y1, y2, y3);
}
#endif

#if PZ_PAIRS
// Decoded groups g and g + gb against R (1..4, compile-time) activation rows x [R, K]
// quantized per 256 (xd [R, K/256], bs16 [R, K/16]): y[r * ldy + 0..15]. mn: the type has
// a minimum (else an offset).
static inline __attribute__((always_inline)) void kb_dot(
    const uint8_t *g, int64_t gb, int mn, const int8_t *x, const float *xd,
    const int16_t *bs16, int64_t K, int R, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g + KB_SB * b, *b1 = b0 + gb;
        const int8_t *xb = x + 256 * b;
        __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
        for (int j = 0; j < 16; j += 2) {  // two sub-blocks at a time: 8 chains of 4
            __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
            __m512i c0 = a0, c1 = a0, c2 = a0, c3 = a0;
            const uint8_t *v0 = b0 + KB_V + 128 * j, *v1 = b1 + KB_V + 128 * j;
#define LS_PR(r, s, u)                                                                        \
    do {                                                                                      \
        const int8_t *xr = xb + (r) * K + 16 * j + 4 * t;                                      \
        s = _mm512_dpbusd_epi32(s, wa, pz_bcast4(xr));                                         \
        u = _mm512_dpbusd_epi32(u, wb, pz_bcast4(xr + 16));                                    \
    } while (0)
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const __m512i wa = pz_load2(v0 + 32 * t, v1 + 32 * t);
                const __m512i wb = pz_load2(v0 + 128 + 32 * t, v1 + 128 + 32 * t);
                LS_PR(0, a0, c0);
                if (R > 1) LS_PR(1, a1, c1);
                if (R > 2) LS_PR(2, a2, c2);
                if (R > 3) LS_PR(3, a3, c3);
            }
#undef LS_PR
            const __m512i sa = pz_load2(b0 + KB_SC + 32 * j, b1 + KB_SC + 32 * j);
            const __m512i sb = pz_load2(b0 + KB_SC + 32 * j + 32, b1 + KB_SC + 32 * j + 32);
#define LS_PS(r, s, u, acc)                                                                   \
    acc = _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_mullo_epi32(s, sa), _mm512_mullo_epi32(u, sb)))
            LS_PS(0, a0, c0, i0);
            if (R > 1) LS_PS(1, a1, c1, i1);
            if (R > 2) LS_PS(2, a2, c2, i2);
            if (R > 3) LS_PS(3, a3, c3, i3);
#undef LS_PS
        }
        __m512i mp[8];
        for (int k = 0; k < 8; k++) mp[k] = pz_load2(b0 + KB_MP + 32 * k, b1 + KB_MP + 32 * k);
        const __m512 d = _mm512_castsi512_ps(pz_load2(b0, b1));
        const __m512 dm = _mm512_castsi512_ps(pz_load2(b0 + KB_DM, b1 + KB_DM));
#define LS_PF(r, acc, yy)                                                                     \
    PK_SB_END(512, acc, yy, mp, 8, bs16 + (r) * (K / 16) + 16 * b, 0, mn, d, dm, xd[(r) * nb + b])
        PZ_EACH(LS_PF);
#undef LS_PF
    }
    PZ_STORE(y, ldy);
}
#endif

// Bytes of scratch ls_kbytes_task needs for ng groups of K values.
static inline int64_t kb_scratch_bytes(int64_t K, int64_t ng) {
    return ng * (K / 256) * KB_SB + 8 * K + 4 * (K / 16 + 16) + 8 * (K / 256 + 1) + 8 * (K / 16) + 256;
}
