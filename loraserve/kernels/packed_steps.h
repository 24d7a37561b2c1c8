// The steps the packed K-quant tiles share (packed_q3.h, packed_q6.h, packed_k.h, packed_kb.h,
// packed_zk.h), written once for 256-bit vectors (one group of 8 rows) and 512-bit ones (two
// groups): W is 256 or 512, pasted into the intrinsics' names (_mm##W##_...).
//
// Numbers: exact integer steps (int16 pair sums that fit, madd / dpwssd: the same sum) and
// kquant.h's float steps in its order, so every tile that takes them keeps its bits.

#pragma once

#include "packed.h"

#if defined(__AVX2__)
// acc + the int16 pair sums p16 times the int16 pairs sv (dpwssd: madd then add in one
// instruction where there is AVX-512 VNNI; the same integers)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define PK_KMADD256(acc, p16, sv) _mm256_dpwssd_epi32(acc, p16, sv)
#else
#define PK_KMADD256(acc, p16, sv) _mm256_add_epi32(acc, _mm256_madd_epi16(p16, sv))
#endif
#define PK_KMADD512(acc, p16, sv) _mm512_dpwssd_epi32(acc, p16, sv)
#define PK_BC256 pk_bcast4
#define PK_BC512 pz_bcast4  // packed_z.h

// int32 lanes lo and hi (each within int16) as the int16 pairs (lo, hi) of the same lanes
#define PK_PAIRS16(W, lo, hi)                                                                 \
    _mm##W##_or_si##W(_mm##W##_and_si##W(lo, _mm##W##_set1_epi32(0xFFFF)), _mm##W##_slli_epi32(hi, 16))

// acc + one 16-value sub-block: steps w0..w3 (u8, 4 values of each row lane) against the
// activations at xr (4 bytes a step), two steps summed in int16 (u <= 63, |x| <= 128: at
// most 32256, exact), times the sub-block's scale pairs sp
#define PK_SUB16(W, acc, w0, w1, w2, w3, xr, sp)                                              \
    do {                                                                                      \
        acc = PK_KMADD##W(acc, _mm##W##_add_epi16(_mm##W##_maddubs_epi16(w0, PK_BC##W(xr)),     \
                                                  _mm##W##_maddubs_epi16(w1, PK_BC##W((xr) + 4))), sp); \
        acc = PK_KMADD##W(acc, _mm##W##_add_epi16(_mm##W##_maddubs_epi16(w2, PK_BC##W((xr) + 8)), \
                                                  _mm##W##_maddubs_epi16(w3, PK_BC##W((xr) + 12))), sp); \
    } while (0)

// The end of a super-block for one activation row: ms = sum_k mp[k] * (bs[2k], bs[2k + 1])
// over n pairs of sub-blocks (bs: the row's int16 sub-block sums), then kquant.h's steps
// with xs = xf: where mn (a minimum), yy = yy + (d * xs) * acc; yy = yy - (dm * xs) * ms;
// else (an offset) yy = yy + (d * xs) * (acc - (ms << sh)).
#define PK_SB_END(W, acc, yy, mp, n, bs, sh, mn, d, dm, xf)                                   \
    do {                                                                                      \
        __m##W##i ms_ = _mm##W##_madd_epi16((mp)[0], _mm##W##_set1_epi32(*(const int32_t *)(bs))); \
        for (int k_ = 1; k_ < (n); k_++)                                                      \
            ms_ = _mm##W##_add_epi32(                                                         \
                ms_, _mm##W##_madd_epi16((mp)[k_], _mm##W##_set1_epi32(*(const int32_t *)((bs) + 2 * k_)))); \
        const __m##W##i is_ = (mn) ? (acc) : _mm##W##_sub_epi32(acc, _mm##W##_slli_epi32(ms_, sh)); \
        const __m##W xs_ = _mm##W##_set1_ps(xf);                                              \
        yy = _mm##W##_add_ps(yy, _mm##W##_mul_ps(_mm##W##_mul_ps(d, xs_), _mm##W##_cvtepi32_ps(is_))); \
        if (mn) yy = _mm##W##_sub_ps(yy, _mm##W##_mul_ps(_mm##W##_mul_ps(dm, xs_), _mm##W##_cvtepi32_ps(ms_))); \
    } while (0)
#endif
