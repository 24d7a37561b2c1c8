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

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30,
};

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

// ---- activation quantization ---------------------------------------------------------

// x [M, K] (row stride ldx) -> q [M, K] int8, d [M, K/32] scales, ms [M, K/16] = d * sum(q)
// over each 16. A block holding a non-finite value gets a NaN scale, so the matmul's output
// is non-finite too (never silently finite).
void ls_quantize_rows(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, float *d,
                      float *ms, int nthreads) {
    if (M * K < (1 << 16)) nthreads = 1;  // a few rows: waking a thread costs more
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * ldx;
        for (int64_t b = 0; b < K / 32; b++) {
            const float *xb = xr + 32 * b;
            float amax = 0.0f;
            int bad = 0;
            for (int i = 0; i < 32; i++) {
                float a = fabsf(xb[i]);
                bad |= !isfinite(a);
                amax = a > amax ? a : amax;
            }
            float dd = amax / 127.0f;
            float id = dd != 0.0f ? 1.0f / dd : 0.0f;
            int8_t *qb = q + m * K + 32 * b;
            int s0 = 0, s1 = 0;
            for (int i = 0; i < 32; i++) {
                int v = bad ? 0 : (int)roundf(xb[i] * id);
                qb[i] = (int8_t)v;
                if (i < 16) s0 += v; else s1 += v;
            }
            if (bad) dd = NAN;
            d[m * (K / 32) + b] = dd;
            ms[m * (K / 16) + 2 * b] = dd * (float)s0;
            ms[m * (K / 16) + 2 * b + 1] = dd * (float)s1;
        }
    }
}

// ---- weight rows -> int8 values, scale and offset per 16 -------------------------------

typedef void (*unpack_fn)(const uint8_t *row, int64_t K, int8_t *q, float *s, float *mn);

static void unpack_q4_0(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    for (int64_t b = 0; b < K / 32; b++, r += 18, q += 32) {
        float d = half_to_float(r);
        for (int i = 0; i < 16; i++) {
            q[i] = (int8_t)((r[2 + i] & 15) - 8);
            q[i + 16] = (int8_t)((r[2 + i] >> 4) - 8);
        }
        s[2 * b] = s[2 * b + 1] = d;
        mn[2 * b] = mn[2 * b + 1] = 0.0f;
    }
}

static void unpack_q4_1(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    for (int64_t b = 0; b < K / 32; b++, r += 20, q += 32) {
        float d = half_to_float(r), m = half_to_float(r + 2);
        for (int i = 0; i < 16; i++) {
            q[i] = (int8_t)(r[4 + i] & 15);
            q[i + 16] = (int8_t)(r[4 + i] >> 4);
        }
        s[2 * b] = s[2 * b + 1] = d;
        mn[2 * b] = mn[2 * b + 1] = m;
    }
}

static void unpack_q5(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn, int with_min) {
    const int size = with_min ? 24 : 22, off = with_min ? 8 : 6, zero = with_min ? 0 : 16;
    for (int64_t b = 0; b < K / 32; b++, r += size, q += 32) {
        float d = half_to_float(r), m = with_min ? half_to_float(r + 2) : 0.0f;
        uint32_t qh;
        memcpy(&qh, r + off - 4, 4);
        for (int i = 0; i < 16; i++) {
            q[i] = (int8_t)(((r[off + i] & 15) | (((qh >> i) & 1) << 4)) - zero);
            q[i + 16] = (int8_t)(((r[off + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - zero);
        }
        s[2 * b] = s[2 * b + 1] = d;
        mn[2 * b] = mn[2 * b + 1] = m;
    }
}

static void unpack_q5_0(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    unpack_q5(r, K, q, s, mn, 0);
}

static void unpack_q5_1(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    unpack_q5(r, K, q, s, mn, 1);
}

static void unpack_q8_0(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    for (int64_t b = 0; b < K / 32; b++, r += 34, q += 32) {
        s[2 * b] = s[2 * b + 1] = half_to_float(r);
        mn[2 * b] = mn[2 * b + 1] = 0.0f;
        memcpy(q, r + 2, 32);
    }
}

static void unpack_q2_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // 16 scale bytes (low nibble scale, high nibble min) | 64 bytes of 2-bit q | d | dmin
    for (int64_t b = 0; b < K / 256; b++, r += 84, q += 256, s += 16, mn += 16) {
        float d = half_to_float(r + 80), dmin = half_to_float(r + 82);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    q[h * 128 + j * 32 + l] = (int8_t)((r[16 + h * 32 + l] >> (2 * j)) & 3);
        for (int j = 0; j < 16; j++) {
            s[j] = d * (float)(r[j] & 15);
            mn[j] = -(dmin * (float)(r[j] >> 4));
        }
    }
}

static void unpack_q3_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // hmask 32 | qs 64 (2-bit) | 12 bytes of 6-bit scales | d
    for (int64_t b = 0; b < K / 256; b++, r += 110, q += 256, s += 16, mn += 16) {
        float d = half_to_float(r + 108);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) {
                    int lo = (r[32 + h * 32 + l] >> (2 * j)) & 3;
                    int hb = (r[l] >> (h * 4 + j)) & 1;  // set: no offset; clear: minus 4
                    q[h * 128 + j * 32 + l] = (int8_t)(lo - ((hb ^ 1) << 2));
                }
        for (int i = 0; i < 16; i++) {
            int lo = i < 8 ? r[96 + i] & 15 : r[96 + i - 8] >> 4;
            int hi = (r[104 + (i & 3)] >> (2 * (i >> 2))) & 3;
            s[i] = d * (float)((lo | (hi << 4)) - 32);
            mn[i] = 0.0f;
        }
    }
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes
static void k_scales(const uint8_t *sb, float d, float dmin, float *s, float *mn) {
    // the 12 bytes as ggml packs them: bytes of u[0..1] become the 8 scales, of u[2..3] the
    // 8 mins (6 bits each); this runs once per 256 values of a row, so it is kept short
    uint32_t u[4];
    memcpy(u, sb, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    const uint32_t mins_lo = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = mins_lo;
    u[0] &= m1;
#if defined(__AVX2__)
    __m256 vs = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                 _mm_set_epi32(0, 0, (int)u[1], (int)u[0]))));
    __m256 vm = _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                 _mm_set_epi32(0, 0, (int)u[3], (int)u[2]))));
    vm = _mm256_xor_ps(vm, _mm256_set1_ps(-0.0f));  // -(dmin * m), exactly
    __m256 lo = _mm256_unpacklo_ps(vs, vs), hi = _mm256_unpackhi_ps(vs, vs);
    _mm256_storeu_ps(s, _mm256_permute2f128_ps(lo, hi, 0x20));  // s0 s0 s1 s1 .. s3 s3
    _mm256_storeu_ps(s + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    lo = _mm256_unpacklo_ps(vm, vm);
    hi = _mm256_unpackhi_ps(vm, vm);
    _mm256_storeu_ps(mn, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(mn + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
#else
    const uint8_t *b = (const uint8_t *)u;
    for (int j = 0; j < 8; j++) {
        s[2 * j] = s[2 * j + 1] = d * (float)b[j];
        mn[2 * j] = mn[2 * j + 1] = -(dmin * (float)b[8 + j]);
    }
#endif
}

static void unpack_q4_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // d | dmin | 12 scale bytes | 128 bytes of nibbles (4 groups of 32 bytes)
    for (int64_t b = 0; b < K / 256; b++, r += 144, q += 256, s += 16, mn += 16) {
        k_scales(r + 4, half_to_float(r), half_to_float(r + 2), s, mn);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                q[g * 64 + l] = (int8_t)(r[16 + g * 32 + l] & 15);
                q[g * 64 + 32 + l] = (int8_t)(r[16 + g * 32 + l] >> 4);
            }
    }
}

static void unpack_q5_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // d | dmin | 12 scale bytes | qh 32 | 128 bytes of nibbles
    for (int64_t b = 0; b < K / 256; b++, r += 176, q += 256, s += 16, mn += 16) {
        k_scales(r + 4, half_to_float(r), half_to_float(r + 2), s, mn);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int lo = r[48 + g * 32 + l] & 15, hi = r[48 + g * 32 + l] >> 4;
                q[g * 64 + l] = (int8_t)(lo | (((r[16 + l] >> (2 * g)) & 1) << 4));
                q[g * 64 + 32 + l] = (int8_t)(hi | (((r[16 + l] >> (2 * g + 1)) & 1) << 4));
            }
    }
}

static void unpack_q6_k(const uint8_t *r, int64_t K, int8_t *q, float *s, float *mn) {
    // ql 128 | qh 64 | 16 int8 scales | d
    for (int64_t b = 0; b < K / 256; b++, r += 210, q += 256, s += 16, mn += 16) {
        float d = half_to_float(r + 208);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++) {  // values h*128 + j*32 + l
                const uint8_t *ql = r + h * 64 + (j & 1) * 32, *qh = r + 128 + h * 32;
                const int ls = 4 * (j >> 1), hs = 2 * j;
                for (int l = 0; l < 32; l++)
                    q[h * 128 + j * 32 + l] =
                        (int8_t)((((ql[l] >> ls) & 15) | (((qh[l] >> hs) & 3) << 4)) - 32);
            }
        for (int j = 0; j < 16; j++) {
            s[j] = d * (float)(int8_t)r[192 + j];
            mn[j] = 0.0f;
        }
    }
}

static unpack_fn unpacker(int type, int *has_min) {
    *has_min = type == T_Q4_1 || type == T_Q5_1 || type == T_Q2_K || type == T_Q4_K ||
               type == T_Q5_K;
    switch (type) {
    case T_Q4_0: return unpack_q4_0;
    case T_Q4_1: return unpack_q4_1;
    case T_Q5_0: return unpack_q5_0;
    case T_Q5_1: return unpack_q5_1;
    case T_Q8_0: return unpack_q8_0;
    case T_Q2_K: return unpack_q2_k;
    case T_Q3_K: return unpack_q3_k;
    case T_Q4_K: return unpack_q4_k;
    case T_Q5_K: return unpack_q5_k;
    case T_Q6_K: return unpack_q6_k;
    default: return NULL;
    }
}

// ---- dot products ----------------------------------------------------------------------

#if defined(__AVX2__)
static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline __m256 madd8(__m256 a, __m256 b, __m256 c) {
#if defined(__FMA__)
    return _mm256_fmadd_ps(a, b, c);
#else
    return _mm256_add_ps(_mm256_mul_ps(a, b), c);
#endif
}

// 32 int8 x 32 int8 -> 8 int32 lanes: lanes 0-3 sum values 0-15, lanes 4-7 values 16-31.
// Exact: |w| <= 128 and |x| <= 127, so no int16 pair sum saturates.
static inline __m256i dot32_i8(__m256i w, __m256i x) {
    __m256i aw = _mm256_sign_epi8(w, w), sx = _mm256_sign_epi8(x, w);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
#endif
}
#endif

// ---- direct decoding: the common types are read from the file's blocks in SIMD -----------

// Scales (per 16 values) and offsets of one row of a directly decoded type.
static void row_scales(int type, const uint8_t *r, int64_t K, float *s, float *mn) {
    const int64_t nc = K / 32;
    switch (type) {
    case T_Q8_0: case T_Q4_0: case T_Q5_0: {
        const int size = type == T_Q8_0 ? 34 : type == T_Q4_0 ? 18 : 22;
        for (int64_t c = 0; c < nc; c++) s[2 * c] = s[2 * c + 1] = half_to_float(r + size * c);
        break;
    }
    case T_Q4_K:
        for (int64_t b = 0; b < K / 256; b++)
            k_scales(r + 144 * b + 4, half_to_float(r + 144 * b), half_to_float(r + 144 * b + 2),
                     s + 16 * b, mn + 16 * b);
        break;
    case T_Q6_K:
        for (int64_t b = 0; b < K / 256; b++) {
            float d = half_to_float(r + 210 * b + 208);
            for (int j = 0; j < 16; j++) s[16 * b + j] = d * (float)(int8_t)r[210 * b + 192 + j];
        }
        break;
    }
}

#if defined(__AVX2__)
#define HAVE_DIRECT 1
#else
#define HAVE_DIRECT 0
#endif

static int direct(int type) {
    return type == T_Q8_0 || type == T_Q4_0 || type == T_Q5_0 || type == T_Q4_K || type == T_Q6_K;
}

#define T_BUF (-1)  // values from the unpack buffer

#if defined(__AVX2__)
// The 32 int8 values of chunk c of a row (the same numbers the unpack functions write).
static inline __attribute__((always_inline)) __m256i chunk_values(int type, const uint8_t *r,
                                                                   const int8_t *qbuf, int64_t c) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    switch (type) {
    case T_Q8_0:
        return _mm256_loadu_si256((const __m256i *)(r + 34 * c + 2));
    case T_Q4_0: {
        __m128i t = _mm_loadu_si128((const __m128i *)(r + 18 * c + 2));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), lo4);
        return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    }
    case T_Q5_0: {
        const uint8_t *b = r + 22 * c;
        __m128i t = _mm_loadu_si128((const __m128i *)(b + 6));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), lo4);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        // byte i = 0xFF where bit i of qh is set
        __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
        bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                 _mm256_set1_epi64x(-1));
        // (nibble | bit << 4) - 16: the nibble where the bit is set, nibble - 16 elsewhere
        return _mm256_or_si256(v, _mm256_andnot_si256(bits, _mm256_set1_epi8((char)0xF0)));
    }
    case T_Q4_K: {
        const int64_t j = c % 8;
        __m256i v = _mm256_loadu_si256((const __m256i *)(r + 144 * (c / 8) + 16 + (j / 2) * 32));
        if (j & 1) v = _mm256_srli_epi16(v, 4);
        return _mm256_and_si256(v, lo4);
    }
    case T_Q6_K: {
        const int64_t j = c % 8, h = j / 4, jj = j % 4;
        const uint8_t *b = r + 210 * (c / 8);
        __m256i l = _mm256_loadu_si256((const __m256i *)(b + h * 64 + (jj & 1) * 32));
        if (jj >> 1) l = _mm256_srli_epi16(l, 4);
        __m256i hi = _mm256_loadu_si256((const __m256i *)(b + 128 + h * 32));
        hi = _mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128((int)(2 * jj))),
                              _mm256_set1_epi8(3));
        __m256i v = _mm256_or_si256(_mm256_and_si256(l, lo4), _mm256_slli_epi16(hi, 4));
        return _mm256_sub_epi8(v, _mm256_set1_epi8(32));
    }
    default:
        return _mm256_loadu_si256((const __m256i *)(qbuf + 32 * c));
    }
}
#endif

// sum_j mn[j] * xms[j]: the offsets' contribution (types with a min), in one fixed order
// (8 lanes, then the lanes' sum, then the tail), the same for every caller.
static inline float min_term(const float *mn, const float *xms, int64_t n) {
    int64_t j = 0;
    float t = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8)
        acc = madd8(_mm256_loadu_ps(mn + j), _mm256_loadu_ps(xms + j), acc);
    t = hsum8(acc);
#endif
    for (; j < n; j++) t += mn[j] * xms[j];
    return t;
}

// One weight row against R activation rows (R a compile-time constant: 1 or 4). Every
// output gets exactly the same operations in the same order whatever R is and whether the
// values are decoded in place or read from the unpack buffer, so no bit depends on the
// batch. s/mn: scales and offsets per 16 values (mn with has_min); sv: the scales as one
// 8-lane vector per chunk (R = 4 only).
static inline __attribute__((always_inline)) void dot_rows(
    int type, const uint8_t *row, const int8_t *qbuf, const float *s, const float *sv,
    const float *mn, int has_min, const int8_t *x, const float *xd, const float *xms,
    int64_t K, int R, float *out, int64_t ldy) {
    const int64_t nc = K / 32;
#if defined(__AVX2__)
    // four named accumulators (an array of them was spilled to the stack every chunk)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_DOT(aw, sx) _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx)
#else
#define LS_DOT(aw, sx) _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1))
#endif
    // exact: |w| <= 128 and |x| <= 127, so no int16 pair sum saturates
#define LS_ROW(r, acc)                                                                        \
    do {                                                                                      \
        __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x + (r) * K + 32 * c)), w); \
        __m256 sc = _mm256_mul_ps(scw, _mm256_broadcast_ss(xd + (r) * nc + c));               \
        acc = madd8(_mm256_cvtepi32_ps(LS_DOT(aw, sx)), sc, acc);                             \
    } while (0)
    for (int64_t c = 0; c < nc; c++) {
        __m256i w = chunk_values(type, row, qbuf, c);
        __m256i aw = _mm256_sign_epi8(w, w);
        __m256 scw = R == 1 ? _mm256_set_m128(_mm_set1_ps(s[2 * c + 1]), _mm_set1_ps(s[2 * c]))
                            : _mm256_loadu_ps(sv + 8 * c);
        LS_ROW(0, a0);
        if (R == 4) {
            LS_ROW(1, a1);
            LS_ROW(2, a2);
            LS_ROW(3, a3);
        }
    }
#undef LS_ROW
    out[0] = hsum8(a0);
    if (R == 4) {
        out[ldy] = hsum8(a1);
        out[2 * ldy] = hsum8(a2);
        out[3 * ldy] = hsum8(a3);
    }
#else
    (void)type;
    (void)row;
    (void)sv;
    for (int r = 0; r < R; r++) {
        float t = 0.0f;
        for (int64_t c = 0; c < nc; c++)
            for (int h = 0; h < 2; h++) {
                int32_t i = 0;
                for (int l = 0; l < 16; l++)
                    i += (int32_t)qbuf[32 * c + 16 * h + l] * (int32_t)x[r * K + 32 * c + 16 * h + l];
                t += (float)i * (s[2 * c + h] * xd[r * nc + c]);
            }
        out[r * ldy] = t;
    }
#endif
    if (has_min)
        for (int r = 0; r < R; r++) out[r * ldy] += min_term(mn, xms + r * (K / 16), K / 16);
}

// NR weight rows (a compile-time constant: 4) against one activation row: for decode,
// where one row's chain of dependent multiply-adds would leave the core waiting. Each
// output gets exactly the operations dot_rows gives it, so tiling changes no bit.
static inline __attribute__((always_inline)) void dot_cols(
    int type, const uint8_t *const *rows, int8_t *const *qb, float *const *s, float *const *mn,
    int has_min, const int8_t *x, const float *xd, const float *xms, int64_t K, int NR,
    float *out) {
#if defined(__AVX2__)
    const int64_t nc = K / 32;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define LS_COL(j, acc)                                                                        \
    do {                                                                                      \
        __m256i w = chunk_values(type, rows[j], qb[j], c);                                    \
        __m256i aw = _mm256_sign_epi8(w, w), sx = _mm256_sign_epi8(xv, w);                    \
        __m256 sc = _mm256_mul_ps(                                                            \
            _mm256_set_m128(_mm_set1_ps(s[j][2 * c + 1]), _mm_set1_ps(s[j][2 * c])), bxd);   \
        acc = madd8(_mm256_cvtepi32_ps(LS_DOT(aw, sx)), sc, acc);                             \
    } while (0)
    for (int64_t c = 0; c < nc; c++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 32 * c));
        __m256 bxd = _mm256_broadcast_ss(xd + c);
        LS_COL(0, a0);
        LS_COL(1, a1);
        LS_COL(2, a2);
        LS_COL(3, a3);
    }
#undef LS_COL
    (void)NR;  // always 4
    out[0] = hsum8(a0);
    out[1] = hsum8(a1);
    out[2] = hsum8(a2);
    out[3] = hsum8(a3);
    if (has_min)
        for (int j = 0; j < NR; j++) out[j] += min_term(mn[j], xms, K / 16);
#else
    for (int j = 0; j < NR; j++)
        dot_rows(type, rows[j], qb[j], s[j], NULL, mn[j], has_min, x, xd, xms, K, 1, out + j, 1);
#endif
}

#define DOT_FNS(T, NAME)                                                                      \
    static void NAME##_1(const uint8_t *row, const int8_t *qb, const float *s, const float *sv, \
                         const float *mn, int hm, const int8_t *x, const float *xd,             \
                         const float *xms, int64_t K, float *out, int64_t ldy) {                \
        dot_rows(T, row, qb, s, sv, mn, hm, x, xd, xms, K, 1, out, ldy);                       \
    }                                                                                         \
    static void NAME##_4(const uint8_t *row, const int8_t *qb, const float *s, const float *sv, \
                         const float *mn, int hm, const int8_t *x, const float *xd,             \
                         const float *xms, int64_t K, float *out, int64_t ldy) {                \
        dot_rows(T, row, qb, s, sv, mn, hm, x, xd, xms, K, 4, out, ldy);                       \
    }                                                                                         \
    static void NAME##_c4(const uint8_t *const *rows, int8_t *const *qb, float *const *s,        \
                          float *const *mn, int hm, const int8_t *x, const float *xd,           \
                          const float *xms, int64_t K, float *out) {                            \
        dot_cols(T, rows, qb, s, mn, hm, x, xd, xms, K, 4, out);                               \
    }
typedef void (*cols_fn)(const uint8_t *const *, int8_t *const *, float *const *, float *const *,
                        int, const int8_t *, const float *, const float *, int64_t, float *);
typedef void (*dot_fn)(const uint8_t *, const int8_t *, const float *, const float *,
                       const float *, int, const int8_t *, const float *, const float *, int64_t,
                       float *, int64_t);
DOT_FNS(T_BUF, dot_buf)
#if defined(__AVX2__)
DOT_FNS(T_Q8_0, dot_q8_0)
DOT_FNS(T_Q4_0, dot_q4_0)
DOT_FNS(T_Q5_0, dot_q5_0)
DOT_FNS(T_Q4_K, dot_q4_k)
DOT_FNS(T_Q6_K, dot_q6_k)
#endif

static void dot_fns(int type, dot_fn *one, dot_fn *four, cols_fn *c4) {
    *one = dot_buf_1;
    *four = dot_buf_4;
    *c4 = dot_buf_c4;
#if defined(__AVX2__)
    switch (type) {
    case T_Q8_0: *one = dot_q8_0_1; *four = dot_q8_0_4; *c4 = dot_q8_0_c4; break;
    case T_Q4_0: *one = dot_q4_0_1; *four = dot_q4_0_4; *c4 = dot_q4_0_c4; break;
    case T_Q5_0: *one = dot_q5_0_1; *four = dot_q5_0_4; *c4 = dot_q5_0_c4; break;
    case T_Q4_K: *one = dot_q4_k_1; *four = dot_q4_k_4; *c4 = dot_q4_k_c4; break;
    case T_Q6_K: *one = dot_q6_k_1; *four = dot_q6_k_4; *c4 = dot_q6_k_c4; break;
    }
#endif
}

static int use_direct(int type) {
    // LORASERVE_KERNEL_UNPACK=1: the scalar unpackers for every type (tests compare both)
    return HAVE_DIRECT && direct(type) && getenv("LORASERVE_KERNEL_UNPACK") == NULL;
}

// How one weight matrix is read: its unpacker or in-place decoder, chosen once per call.
typedef struct {
    int type, has_min, in_place;
    unpack_fn unpack;
    dot_fn one, four;
    cols_fn c4;
    const uint8_t *w;
    int64_t n, row_bytes, col;  // rows, bytes per row, first output column
} part_t;

static int part_init(part_t *p, int type, const uint8_t *w, int64_t n, int64_t row_bytes,
                     int64_t col) {
    p->unpack = unpacker(type, &p->has_min);
    if (p->unpack == NULL) return -1;
    p->type = type;
    p->in_place = use_direct(type);
    dot_fns(p->in_place ? type : T_BUF, &p->one, &p->four, &p->c4);
    p->w = w;
    p->n = n;
    p->row_bytes = row_bytes;
    p->col = col;
    return 0;
}

typedef struct {
    int8_t *qbuf;
    float *s, *mn, *sv;
    int8_t *qb4[4];  // four rows' buffers and scales, for dot_cols
    float *s4[4], *mn4[4];
} scratch_t;

static void scratch_init(scratch_t *t, int64_t K) {
    const size_t qn = (size_t)((K + 63) / 64 * 64), sn = (size_t)(K / 16);
    t->qbuf = aligned_alloc(64, qn);
    t->s = malloc(sizeof(float) * sn);
    t->mn = calloc(sn, sizeof(float));
    t->sv = malloc(sizeof(float) * (size_t)(8 * (K / 32)));
    for (int j = 0; j < 4; j++) {
        t->qb4[j] = aligned_alloc(64, qn);
        t->s4[j] = malloc(sizeof(float) * sn);
        t->mn4[j] = calloc(sn, sizeof(float));
    }
}

static void scratch_free(scratch_t *t) {
    free(t->qbuf);
    free(t->s);
    free(t->mn);
    free(t->sv);
    for (int j = 0; j < 4; j++) {
        free(t->qb4[j]);
        free(t->s4[j]);
        free(t->mn4[j]);
    }
}

// Output columns p->col + n0 .. + 3 of rows m < M (M < 4): four weight rows at a time.
static void part_cols4(const part_t *p, int64_t n0, int64_t K, const int8_t *xq,
                       const float *xd, const float *xms, int64_t M, float *y, int64_t ldy,
                       scratch_t *t) {
    const int64_t nc = K / 32;
    const uint8_t *rows[4];
    for (int j = 0; j < 4; j++) {
        rows[j] = p->w + (n0 + j) * p->row_bytes;
        if (p->in_place) row_scales(p->type, rows[j], K, t->s4[j], t->mn4[j]);
        else p->unpack(rows[j], K, t->qb4[j], t->s4[j], t->mn4[j]);
    }
    for (int64_t m = 0; m < M; m++) {
        float out[4];
        p->c4(rows, t->qb4, t->s4, t->mn4, p->has_min, xq + m * K, xd + m * nc,
              xms + m * (K / 16), K, out);
        for (int j = 0; j < 4; j++) y[m * ldy + p->col + n0 + j] = out[j];
    }
}

// Output column (p->col + n) of all M rows: one weight row against every activation row.
static void part_row(const part_t *p, int64_t n, int64_t K, const int8_t *xq, const float *xd,
                     const float *xms, int64_t M, float *y, int64_t ldy, scratch_t *t) {
    const int64_t nc = K / 32;
    const uint8_t *row = p->w + n * p->row_bytes;
    if (p->in_place) row_scales(p->type, row, K, t->s, t->mn);
    else p->unpack(row, K, t->qbuf, t->s, t->mn);
    if (M >= 4)
        for (int64_t c = 0; c < nc; c++)
            for (int l = 0; l < 4; l++) {
                t->sv[8 * c + l] = t->s[2 * c];
                t->sv[8 * c + 4 + l] = t->s[2 * c + 1];
            }
    float *out = y + p->col + n;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)
        p->four(row, t->qbuf, t->s, t->sv, t->mn, p->has_min, xq + m * K, xd + m * nc,
                xms + m * (K / 16), K, out + m * ldy, ldy);
    for (; m < M; m++)
        p->one(row, t->qbuf, t->s, t->sv, t->mn, p->has_min, xq + m * K, xd + m * nc,
               xms + m * (K / 16), K, out + m * ldy, ldy);
}

// Several matrices of one input side by side on the output columns (q|k|v, gate|up), in
// one parallel region: y[:, cols[i] : cols[i] + ns[i]] = x W_i^T. The rows of all parts
// form one range that the threads split. Returns 0, or -1 for a type without a kernel.
int ls_qmatmul_multi(int nparts, const int *types, const uint8_t *const *ws, const int64_t *ns,
                     const int64_t *row_bytes, const int64_t *cols, int64_t K, const int8_t *xq,
                     const float *xd, const float *xms, int64_t M, float *y, int64_t ldy,
                     int nthreads) {
    part_t parts[8];
    int64_t total = 0;
    if (nparts < 1 || nparts > 8) return -1;
    for (int i = 0; i < nparts; i++) {
        if (part_init(&parts[i], types[i], ws[i], ns[i], row_bytes[i], cols[i]) != 0) return -1;
        total += ns[i];
    }
    if (total * K * M < (1 << 17)) nthreads = 1;  // tiny products: no thread wake-up
    // tasks: blocks of 4 rows of one part (the last block of a part may be shorter)
    int64_t first[9];
    first[0] = 0;
    for (int i = 0; i < nparts; i++) first[i + 1] = first[i] + (parts[i].n + 3) / 4;
    const int64_t n_tasks = first[nparts];
#pragma omp parallel num_threads(nthreads)
    {
        scratch_t t;
        scratch_init(&t, K);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < n_tasks; g++) {
            int i = 0;
            while (g >= first[i + 1]) i++;
            const part_t *p = &parts[i];
            const int64_t n0 = 4 * (g - first[i]), n1 = n0 + 4 < p->n ? n0 + 4 : p->n;
            if (M < 4 && n1 - n0 == 4) {
                part_cols4(p, n0, K, xq, xd, xms, M, y, ldy, &t);
            } else {
                for (int64_t n = n0; n < n1; n++) part_row(p, n, K, xq, xd, xms, M, y, ldy, &t);
            }
        }
        scratch_free(&t);
    }
    return 0;
}

// ls_qmatmul_multi from float32 activations x [M, K] (row stride ldx): quantized here, in
// one call (a decode step makes ~70 of these; each saved round trip is ~15 us).
int ls_qmatmul_multi_f32(int nparts, const int *types, const uint8_t *const *ws,
                         const int64_t *ns, const int64_t *row_bytes, const int64_t *cols,
                         int64_t K, const float *x, int64_t ldx, int64_t M, float *y,
                         int64_t ldy, int nthreads) {
    int8_t *q = malloc((size_t)(M * K));
    float *d = malloc(sizeof(float) * (size_t)(M * (K / 32)));
    float *ms = malloc(sizeof(float) * (size_t)(M * (K / 16)));
    int rc = -2;
    if (q != NULL && d != NULL && ms != NULL) {
        ls_quantize_rows(x, M, K, ldx, q, d, ms, nthreads);
        rc = ls_qmatmul_multi(nparts, types, ws, ns, row_bytes, cols, K, q, d, ms, M, y, ldy,
                              nthreads);
    }
    free(q);
    free(d);
    free(ms);
    return rc;
}

// y [M, N] (row stride ldy) = quantized activations (ls_quantize_rows) x weight rows w
// [N, row_bytes] of ggml `type`. Returns 0, or -1 for a type without a kernel.
int ls_qmatmul(int type, const uint8_t *w, int64_t N, int64_t K, int64_t row_bytes,
               const int8_t *xq, const float *xd, const float *xms, int64_t M, float *y,
               int64_t ldy, int nthreads) {
    const uint8_t *ws[1] = {w};
    const int64_t zero = 0;
    return ls_qmatmul_multi(1, &type, ws, &N, &row_bytes, &zero, K, xq, xd, xms, M, y, ldy,
                            nthreads);
}

// ---- float weights ---------------------------------------------------------------------

static void to_float_row(int type, const uint8_t *r, int64_t K, float *out) {
    if (type == T_F16) {
        for (int64_t k = 0; k < K; k++) out[k] = half_to_float(r + 2 * k);
    } else {  // BF16
        for (int64_t k = 0; k < K; k++) {
            uint16_t h;
            memcpy(&h, r + 2 * k, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(out + k, &bits, 4);
        }
    }
}

static inline float dot_f(const float *w, const float *x, int64_t K) {
    int64_t k = 0;
    float r = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) acc = madd8(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), acc);
    r = hsum8(acc);
#endif
    for (; k < K; k++) r += w[k] * x[k];
    return r;
}

// y [M, N] (row stride ldy) = x [M, K] (row stride ldx) x weight rows w [N, K] of type F32,
// F16 or BF16 (row stride ldw_bytes). Returns 0, or -1 for another type.
int ls_fmatmul(int type, const uint8_t *w, int64_t N, int64_t K, int64_t ldw_bytes,
               const float *x, int64_t ldx, int64_t M, float *y, int64_t ldy, int nthreads) {
    if (type != T_F32 && type != T_F16 && type != T_BF16) return -1;
    if (N * K * M < (1 << 16)) nthreads = 1;  // LoRA's small products: no thread wake-up
#pragma omp parallel num_threads(nthreads)
    {
        float *buf = type == T_F32 ? NULL : malloc(sizeof(float) * (size_t)(K > 0 ? K : 1));
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *wr = (const float *)(w + n * ldw_bytes);
            if (buf != NULL) {
                to_float_row(type, w + n * ldw_bytes, K, buf);
                wr = buf;
            }
            for (int64_t m = 0; m < M; m++) y[m * ldy + n] = dot_f(wr, x + m * ldx, K);
        }
        free(buf);
    }
    return 0;
}
