// K-form weights (Q2_K..Q6_K, IQ4_XS, the grid and ternary types) against activations
// quantized per 256 values, as llama.cpp's Q8_K: one float scale per 256 activations, so a
// super-block's whole dot product is an exact integer, sum_j sc_j * sum_i q_i x_i over its
// 16-value sub-blocks (and, for the types with a minimum, sum_j mn_j * sum_i x_i), scaled
// by two float products once per 256 values.
// The per-32 float scaling of the Q8_0 path cost ~3 vector ops per 32 values; this is the
// step that made K-quant matmuls compute-bound (measured: Q4_K one-row at 9 GB/s).
//
// Numbers, by construction: the integers are exact whatever the SIMD decomposition (the
// in-place decoders, the unpacked rows, 1 or 4 activation rows at a time, the scalar build),
// and the float operations per output are one fixed sequence over the super-blocks:
//     y = 0; for each b: y = y + (d_b * xd_b) * isum_b;  [y = y - (dm_b * xd_b) * msum_b]
// so every path gives the same bits and a row's result never depends on its batch.

#pragma once

#include "quant_dot.h"

#include "iq_chunk.h"
#include "kprep.h"
#include "ksum.h"

// One K-form weight row against R (1 or 4, a compile-time constant) activation rows.
// type: a ggml type decodes in place (scales and values read from the row on the fly:
// kdots.h lists them), T_BUF reads p's values and scales, T_BUF6 Q6_K's values decoded
// once. x: R rows of K int8 (row stride K), xd [R, K/256], bs16 [R, K/16],
// bs32 [R, K/32]; out[r * ldy].
static inline __attribute__((always_inline)) void kdot(
    int type, const uint8_t *row, const kprep_t *p, int has_min, const int8_t *x,
    const float *xd, const int16_t *bs16, const int16_t *bs32, int64_t K, int R, float *out,
    int64_t ldy) {
    const int64_t nb = K / 256;
    float y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#if defined(__AVX2__)
    __m128 y4 = _mm_setzero_ps();  // R == 4: y of the 4 rows, one lane each
    // R == 1: a super-block's horizontal sum and float steps wait until the next one's
    // products are issued (its sums long done then): the same operations on y in the same
    // order, without the sum's latency at the end of every super-block
    __m256i pa = _mm256_setzero_si256();
    int32_t pms = 0;
    float pd = 0.0f, pdm = 0.0f, pxs = 0.0f;
#define LS_FLUSH()                                                                            \
    do {                                                                                      \
        const int32_t is_ = hsum_i32(pa) - (K_OFF(type) ? pms : 0);                            \
        y[0] = y[0] + (pd * pxs) * (float)is_;                                                 \
        if (has_min) y[0] = y[0] - (pdm * pxs) * (float)(K_OFF(type) ? 0 : pms);               \
    } while (0)
#endif
    for (int64_t b = 0; b < nb; b++) {
        if (type >= 0 && type != T_IQ4_XS && p->ahead) {  // lines ahead (in place)
            const int size = k_block_bytes(type);
            const uint8_t *f = row + size * b;
            PREFETCH(f);
            PREFETCH(f + 64);
            if (size > 128) PREFETCH(f + 128);
            if (size > 192) PREFETCH(f + 192);
        }
        int32_t isum[4], msum[4] = {0, 0, 0, 0};
        float d, dm = 0.0f;
#if defined(__AVX2__)
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        __m128i m4 = _mm_setzero_si128();  // R == 4: the rows' msum, one lane each
// acc + the int16 pair sums times the scales sv, summed in pairs (exact: dpwssd is the
// same multiply-add as madd then add, in one instruction where there is AVX-512 VNNI)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_KMADD(acc, p16, sv) _mm256_dpwssd_epi32(acc, p16, sv)
#else
#define LS_KMADD(acc, p16, sv) _mm256_add_epi32(acc, _mm256_madd_epi16(p16, sv))
#endif
// (TQ1_0, TQ2_0: scales 1, so with VNNI one dpbusd, the same sums: u <= 2, |x| <= 127)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_ONE (type == T_TQ1_0 || type == T_TQ2_0)
#else
#define LS_ONE 0
#endif
#define LS_KROW(r, acc, c, aw, sx_of)                                                         \
    do {                                                                                      \
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (r) * K + 32 * (c)));            \
        if (LS_ONE) acc = _mm256_dpbusd_epi32(acc, aw, sx_of);                                \
        else acc = LS_KMADD(acc, _mm256_maddubs_epi16(aw, sx_of), sv);                        \
    } while (0)
// The 4 rows' accumulators held in registers at the end of a loop step: without this
// GCC hoisted the next steps' products ahead into stack temporaries (a store and a load
// each, 32 a super-block). Measured (Zen 2): Q4_K 10240 x 2560 at 4 / 17 / 512 rows 0.94x /
// 0.95x / 0.93x the time, Q6_K 2560 x 10240 at 17 / 512 rows 0.96x. No operation changes.
#define LS_KEEP()                                                                             \
    do {                                                                                      \
        if (R == 4) __asm__("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3));                     \
    } while (0)
// (one row: its chunks alternate between two accumulators, a0 and a1, swapped after each
// chunk -- two chains of dependent multiply-adds instead of one; integer sums, so exact)
#define LS_KROWS(c, aw, sx_of)                                                                \
    do {                                                                                      \
        LS_KROW(0, a0, c, aw, sx_of);                                                         \
        if (R == 1) {                                                                         \
            const __m256i t_ = a0;                                                            \
            a0 = a1;                                                                          \
            a1 = t_;                                                                          \
        }                                                                                     \
        if (R == 4) {                                                                         \
            LS_KROW(1, a1, c, aw, sx_of);                                                     \
            LS_KROW(2, a2, c, aw, sx_of);                                                     \
            LS_KROW(3, a3, c, aw, sx_of);                                                     \
        }                                                                                     \
    } while (0)
        if (type == T_Q4_K || type == T_Q5_K) {  // everything from the block, on the fly
            // Q5_K: Q4_K's fields, then qh[32] (value 64g + l: bit 2g of qh[l], 64g + 32 + l:
            // bit 2g + 1) before the nibbles
            const int q5 = type == T_Q5_K;
            const uint8_t *blk = row + (q5 ? 176 : 144) * b;
            const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
            uint32_t u[4];  // bytes of u[0..1]: the 8 scales, of u[2..3]: the 8 mins
            k_scale_words(blk + 4, u);
            d = half_to_float(blk);
            dm = half_to_float(blk + 2);
            const __m256i scv = _mm256_broadcastsi128_si256(
                _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)u[1], (int)u[0])));
            const __m128i mn16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)u[3], (int)u[2]));
            const __m256i lo4 = _mm256_set1_epi8(0x0F);
            for (int g = 0; g < 4; g++) {  // 64 values: low nibbles, then high nibbles
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (q5 ? 48 : 16) + 32 * g));
                __m256i wl = _mm256_and_si256(v, lo4);
                __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                if (q5) {  // the fifth bits (16-bit shifts: the mask keeps each byte's own)
                    const __m256i b16 = _mm256_set1_epi8(0x10);
                    wl = _mm256_or_si256(wl, _mm256_and_si256(g <= 2 ? _mm256_slli_epi16(qh, 4 - 2 * g)
                                                                     : _mm256_srli_epi16(qh, 2 * g - 4), b16));
                    wh = _mm256_or_si256(wh, _mm256_and_si256(g <= 1 ? _mm256_slli_epi16(qh, 3 - 2 * g)
                                                                     : _mm256_srli_epi16(qh, 2 * g - 3), b16));
                }
                const int64_t c = 8 * b + 2 * g;
                __m256i sv = _mm256_shuffle_epi8(scv, _mm256_load_si256((const __m256i *)KSH32[2 * g]));
                LS_KROWS(c, wl, xv);  // values 0..15: maddubs takes them unsigned as they are
                sv = _mm256_shuffle_epi8(scv, _mm256_load_si256((const __m256i *)KSH32[2 * g + 1]));
                LS_KROWS(c + 1, wh, xv);
                LS_KEEP();
            }
            if (R == 4) {
                // two rows a multiply (row r in the low half, r + 1 in the high), then
                // pair-adds: halves [r0 r2 . .] and [r1 r3 . .], interleaved
#define LS_B(r) (const __m128i *)(bs32 + (r) * (K / 32) + 8 * b)
                const __m256i mn2 = _mm256_broadcastsi128_si256(mn16);
                __m256i h = _mm256_hadd_epi32(
                    _mm256_madd_epi16(mn2, _mm256_loadu2_m128i(LS_B(1), LS_B(0))),
                    _mm256_madd_epi16(mn2, _mm256_loadu2_m128i(LS_B(3), LS_B(2))));
                h = _mm256_hadd_epi32(h, h);
                m4 = _mm_unpacklo_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
#undef LS_B
            } else {
                __m128i t = _mm_madd_epi16(mn16, _mm_loadu_si128((const __m128i *)(bs32 + 8 * b)));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
                msum[0] = _mm_cvtsi128_si32(t);
            }
        } else {
            __m256i sc16, mnv = _mm256_setzero_si256();  // the 16 sub-block scales as int16
            const uint8_t *blk = row + k_block_bytes(type) * b;
            if (type == T_Q6_K || type == T_BUF6) {
                sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
                d = half_to_float(blk + 208);
            } else if (type == T_Q3_K) {  // in place: scales from the block
                sc16 = k_q3_scales(blk + 96);
                d = half_to_float(blk + 108);
            } else if (type == T_Q2_K) {  // in place: scales (low nibbles) and mins (high)
                const __m128i s8 = _mm_loadu_si128((const __m128i *)blk), m15 = _mm_set1_epi8(15);
                sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m15));
                mnv = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m15));
                d = half_to_float(blk + 80);
                dm = half_to_float(blk + 82);
            } else if (type == T_TQ2_0 || type == T_TQ1_0) {  // in place: one d, scales 1
                sc16 = _mm256_set1_epi16(1);
                d = half_to_float(blk + (type == T_TQ2_0 ? 64 : 52));
            } else if (K_GRID(type)) {  // in place: scales from the block
                sc16 = iq_scales16(type, blk, &d);
            } else if (type == T_IQ4_XS) {  // in place: its scales from the block
                int16_t t16[16];
                d = nl_k_scales(type, blk, t16);
                sc16 = _mm256_loadu_si256((const __m256i *)t16);
            } else {
                sc16 = _mm256_loadu_si256((const __m256i *)(p->sc + 16 * b));
                d = p->d[b];
                dm = p->dm[b];
            }
            const __m256i slo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
            const __m256i shi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
            if (type == T_Q6_K || type == T_BUF6 || type == T_Q3_K || type == T_Q2_K ||
                type == T_TQ2_0 || type == T_TQ1_0) {
                // the stored values u = q + o >= 0 (Q6_K: 0..63, o 32; Q3_K: 0..7, o 4;
                // Q2_K: 0..3, o 0; TQ*: 0..2, o 1) go to maddubs unsigned as they are
                // (63 * 127 * 2 fits int16), and o * sum_j sc_j * bs16_j comes off once per
                // super-block: the same integers as the signed form, no sign operations
                // (T_BUF6: Q6_K's values decoded once into the buffer, decode_values)
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const int64_t c = 8 * b + j;
                    const __m256i tq = _mm256_loadu_si256((const __m256i *)(blk + 32 * (j / 4)));
                    const __m256i u = type == T_BUF6 ? _mm256_load_si256((const __m256i *)(p->q + 32 * c))
                                      : type == T_TQ2_0  // Q2_K's 2-bit fields, qs first
                                          ? _mm256_and_si256(_mm256_srli_epi16(tq, 2 * (j % 4)), _mm256_set1_epi8(3))
                                      : type == T_TQ1_0 ? tq1_chunk_u(blk, j)
                                                        : k_chunk_u(type, blk, j);
                    const __m256i sv = _mm256_shuffle_epi8(
                        j < 4 ? slo : shi, _mm256_load_si256((const __m256i *)KSH16[j & 3]));
                    LS_KROWS(c, u, xv);
                    LS_KEEP();
                }
                // held in m4 / msum until the sums below
#define LS_M(r) _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(bs16 + (r) * (K / 16) + 16 * b)))
                if (K_OFF(type) && R == 4)
                    m4 = _mm_mullo_epi32(hsum4_i32(LS_M(0), LS_M(1), LS_M(2), LS_M(3)), _mm_set1_epi32(K_OFF(type)));
                else if (K_OFF(type)) msum[0] = K_OFF(type) * hsum_i32(LS_M(0));
#undef LS_M
            } else if (K_GRID(type)) {  // magnitudes u <= 62 and signs (iq_chunk.h)
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const int64_t c = 8 * b + j;
                    __m256i sg;
                    const __m256i u = iq_chunk(type, blk, j, &sg);
                    const __m256i sv = _mm256_shuffle_epi8(
                        j < 4 ? slo : shi, _mm256_load_si256((const __m256i *)KSH16[j & 3]));
                    LS_KROWS(c, u, _mm256_sign_epi8(xv, sg));
                    LS_KEEP();
                }
            } else {
                for (int j = 0; j < 8; j++) {
                    const int64_t c = 8 * b + j;
                    const __m256i w = chunk_values(type, row, p ? p->q : NULL, c);
                    const __m256i aw = _mm256_sign_epi8(w, w);
                    const __m256i sv = _mm256_shuffle_epi8(
                        j < 4 ? slo : shi, _mm256_load_si256((const __m256i *)KSH16[j & 3]));
                    LS_KROWS(c, aw, _mm256_sign_epi8(xv, w));
                    LS_KEEP();
                }
            }
            if (has_min) {
                if (type != T_Q2_K) mnv = _mm256_loadu_si256((const __m256i *)(p->mn + 16 * b));
#define LS_M(r) _mm256_madd_epi16(mnv, _mm256_loadu_si256((const __m256i *)(bs16 + (r) * (K / 16) + 16 * b)))
                if (R == 4) m4 = hsum4_i32(LS_M(0), LS_M(1), LS_M(2), LS_M(3));
                else msum[0] = hsum_i32(LS_M(0));
#undef LS_M
            }
        }
#undef LS_KROWS
#undef LS_KROW
#undef LS_KMADD
#undef LS_ONE
#undef LS_KEEP
        if (R == 4) {  // the 4 rows' sums and float steps side by side, one lane each:
            // per lane exactly the scalar operations below (integer sums are exact in any
            // order; -ffp-contract=off keeps each float multiply and add as written)
            __m128i i4 = hsum4_i32(a0, a1, a2, a3);
            if (K_OFF(type)) {  // the offset of the unsigned values
                i4 = _mm_sub_epi32(i4, m4);
                m4 = _mm_setzero_si128();
            }
            const __m128 xs4 = _mm_set_ps(xd[3 * nb + b], xd[2 * nb + b], xd[nb + b], xd[b]);
            y4 = _mm_add_ps(y4, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(d), xs4), _mm_cvtepi32_ps(i4)));
            if (has_min)
                y4 = _mm_sub_ps(y4, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(dm), xs4), _mm_cvtepi32_ps(m4)));
            continue;
        }
        if (b > 0) LS_FLUSH();  // the previous super-block's steps (K_OFF: less its offset sum)
        pa = _mm256_add_epi32(a0, a1), pms = msum[0], pd = d, pdm = dm, pxs = xd[b];
        (void)isum;
        continue;
#else
        (void)row;
        (void)bs32;
        d = p->d[b];
        dm = p->dm[b];
        for (int r = 0; r < R; r++) {
            int32_t s = 0;
            for (int j = 0; j < 16; j++) {
                int32_t t = 0;
                for (int i = 16 * j; i < 16 * j + 16; i++)
                    t += (int32_t)p->q[256 * b + i] * x[r * K + 256 * b + i];
                s += p->sc[16 * b + j] * t;
            }
            isum[r] = s;
            if (has_min) msum[r] = k_msum(p->mn + 16 * b, bs16 + r * (K / 16) + 16 * b);
        }
#endif
        for (int r = 0; r < R; r++) {
            const float xs = xd[r * nb + b];
            y[r] = y[r] + (d * xs) * (float)isum[r];
            if (has_min) y[r] = y[r] - (dm * xs) * (float)msum[r];
        }
    }
#if defined(__AVX2__)
    if (R == 4) _mm_storeu_ps(y, y4);
    else if (nb > 0) LS_FLUSH();
#undef LS_FLUSH
#endif
    for (int r = 0; r < R; r++) out[r * ldy] = y[r];
}
