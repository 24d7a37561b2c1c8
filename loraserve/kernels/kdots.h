// kquant.h's kdot for each type it reads in place (and T_BUF: values unpacked first), for 1
// and 4 activation rows, and the choice of them per type (qpart.h's part_init).

#pragma once

#include "kquant.h"

#define KDOT_FNS(T, NAME)                                                                     \
    static void NAME##_1(const uint8_t *row, const kprep_t *p, int hm, const int8_t *x,        \
                         const float *xd, const int16_t *bs, const int16_t *b32, int64_t K,    \
                         float *out, int64_t ldy) {                                            \
        kdot(T, row, p, hm, x, xd, bs, b32, K, 1, out, ldy);                                   \
    }                                                                                         \
    static void NAME##_4(const uint8_t *row, const kprep_t *p, int hm, const int8_t *x,        \
                         const float *xd, const int16_t *bs, const int16_t *b32, int64_t K,    \
                         float *out, int64_t ldy) {                                            \
        kdot(T, row, p, hm, x, xd, bs, b32, K, 4, out, ldy);                                   \
    }
typedef void (*kdot_fn)(const uint8_t *, const kprep_t *, int, const int8_t *, const float *,
                        const int16_t *, const int16_t *, int64_t, float *, int64_t);
KDOT_FNS(T_BUF, kdot_buf)
#if defined(__AVX2__)
KDOT_FNS(T_Q4_K, kdot_q4_k)
KDOT_FNS(T_Q5_K, kdot_q5_k)
KDOT_FNS(T_Q6_K, kdot_q6_k)
KDOT_FNS(T_Q2_K, kdot_q2_k)
KDOT_FNS(T_Q3_K, kdot_q3_k)
KDOT_FNS(T_BUF6, kdot_q6b)
KDOT_FNS(T_IQ4_XS, kdot_iq4xs)
KDOT_FNS(T_TQ2_0, kdot_tq2)
KDOT_FNS(T_TQ1_0, kdot_tq1)
KDOT_FNS(T_IQ2_XXS, kdot_iq2xxs)
KDOT_FNS(T_IQ2_XS, kdot_iq2xs)
KDOT_FNS(T_IQ2_S, kdot_iq2s)
KDOT_FNS(T_IQ3_XXS, kdot_iq3xxs)
KDOT_FNS(T_IQ3_S, kdot_iq3s)
KDOT_FNS(T_IQ1_S, kdot_iq1s)
KDOT_FNS(T_IQ1_M, kdot_iq1m)
#endif

// The dot products of a K-form type read in place (k1: 1 activation row, k4: 4), or 0 where
// its rows are unpacked first (T_BUF: every type without AVX2).
static inline int kdot_in_place(int type, kdot_fn *k1, kdot_fn *k4) {
#if defined(__AVX2__)
#define LS_K(T, NAME)                                                                         \
    case T: *k1 = NAME##_1, *k4 = NAME##_4; return 1
    switch (type) {
    LS_K(T_Q2_K, kdot_q2_k);
    LS_K(T_Q3_K, kdot_q3_k);
    LS_K(T_Q4_K, kdot_q4_k);
    LS_K(T_Q5_K, kdot_q5_k);
    LS_K(T_Q6_K, kdot_q6_k);
    LS_K(T_IQ4_XS, kdot_iq4xs);
    LS_K(T_TQ2_0, kdot_tq2);
    LS_K(T_TQ1_0, kdot_tq1);
    LS_K(T_IQ2_XXS, kdot_iq2xxs);
    LS_K(T_IQ2_XS, kdot_iq2xs);
    LS_K(T_IQ2_S, kdot_iq2s);
    LS_K(T_IQ3_XXS, kdot_iq3xxs);
    LS_K(T_IQ3_S, kdot_iq3s);
    LS_K(T_IQ1_S, kdot_iq1s);
    LS_K(T_IQ1_M, kdot_iq1m);
    default: break;
    }
#undef LS_K
#endif
    (void)type, (void)k1, (void)k4;
    return 0;
}
