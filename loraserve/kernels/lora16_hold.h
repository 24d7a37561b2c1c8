// lora16.c's ls_lora16_hold: an adapter's float16 pairs copied into the form lora16.c reads
// (A as it is, B in 8-output tiles and its tail), checking every value on the way.

#pragma once

#include <stdint.h>
#include <string.h>

// The held form of n float16 pairs, copied in one pass that also checks every value is
// finite. A load used to run two or three torch copies per pair (252 tensors for Gemma
// 270M's 126 targets) and a separate pass over the file for the check: 5.8 of a read's 13.1
// ms of thread CPU, now 2.0 ms in one call (10.1 ms a read; 1 thread, rank-8/16 f16
// adapters). A [r, in] as it is into a_dst, B [out, r] into 8-output tiles bt_dst [out / 8, r, 8]
// (tile t holds B[8t + i, j] at (t, j, i), as lora16.py's `tiles`) and its rows past the
// last whole tile into tail_dst [out % 8, r]. Plain copies: the same halves, bit for bit.
// Returns 0 when every value is finite, 1 when one is not (the copies made all the same),
// -3 for bad sizes.
static inline uint16_t mag_max(const uint16_t *p, int64_t n, uint16_t m) {
    for (int64_t i = 0; i < n; i++) {
        const uint16_t v = p[i] & 0x7FFF;
        m = v > m ? v : m;
    }
    return m;
}

int ls_lora16_hold(int n, const uint16_t *const *a_src, const uint16_t *const *b_src,
                   const int64_t *ranks, const int64_t *ins, const int64_t *outs,
                   uint16_t *const *a_dst, uint16_t *const *bt_dst, uint16_t *const *tail_dst) {
    uint16_t m = 0;  // the largest magnitude bits seen: 0x7C00 and up is an inf or a NaN
    for (int p = 0; p < n; p++) {
        const int64_t r = ranks[p], K = ins[p], N = outs[p], n8 = N / 8 * 8;
        if (r < 0 || K < 0 || N < 0 || (r * K && (a_src[p] == NULL || a_dst[p] == NULL)) ||
            (r * n8 && (b_src[p] == NULL || bt_dst[p] == NULL)) ||
            (r * (N - n8) && tail_dst[p] == NULL))
            return -3;
        if (r * K) {
            memcpy(a_dst[p], a_src[p], (size_t)(r * K) * 2);
            m = mag_max(a_src[p], r * K, m);
        }
        const uint16_t *b = b_src[p];
        uint16_t *bt = bt_dst[p];
        const int64_t r8 = r / 8 * 8;
        (void)r8;
        for (int64_t t = 0; t < n8 / 8; t++) {
            const uint16_t *rows = b + 8 * t * r;  // B[8t .. 8t + 8) [8, r]
            uint16_t *tile = bt + t * r * 8;      // [r, 8]
            int64_t j = 0;
#if defined(__AVX2__)
            __m128i mm = _mm_setzero_si128();
            const __m128i mag = _mm_set1_epi16(0x7FFF);
            for (; j < r8; j += 8) {  // an 8 x 8 transpose of halves
                __m128i v[8];
                for (int i = 0; i < 8; i++) {
                    v[i] = _mm_loadu_si128((const __m128i *)(rows + i * r + j));
                    mm = _mm_max_epu16(mm, _mm_and_si128(v[i], mag));
                }
                const __m128i a0 = _mm_unpacklo_epi16(v[0], v[1]), a1 = _mm_unpackhi_epi16(v[0], v[1]);
                const __m128i a2 = _mm_unpacklo_epi16(v[2], v[3]), a3 = _mm_unpackhi_epi16(v[2], v[3]);
                const __m128i a4 = _mm_unpacklo_epi16(v[4], v[5]), a5 = _mm_unpackhi_epi16(v[4], v[5]);
                const __m128i a6 = _mm_unpacklo_epi16(v[6], v[7]), a7 = _mm_unpackhi_epi16(v[6], v[7]);
                const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
                const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
                const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
                const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
                __m128i *o = (__m128i *)(tile + j * 8);  // rank j + c: lanes 0..7
                _mm_storeu_si128(o + 0, _mm_unpacklo_epi64(b0, b4));
                _mm_storeu_si128(o + 1, _mm_unpackhi_epi64(b0, b4));
                _mm_storeu_si128(o + 2, _mm_unpacklo_epi64(b1, b5));
                _mm_storeu_si128(o + 3, _mm_unpackhi_epi64(b1, b5));
                _mm_storeu_si128(o + 4, _mm_unpacklo_epi64(b2, b6));
                _mm_storeu_si128(o + 5, _mm_unpackhi_epi64(b2, b6));
                _mm_storeu_si128(o + 6, _mm_unpacklo_epi64(b3, b7));
                _mm_storeu_si128(o + 7, _mm_unpackhi_epi64(b3, b7));
            }
            uint16_t lanes[8];
            _mm_storeu_si128((__m128i *)lanes, mm);
            for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
#endif
            for (; j < r; j++)
                for (int i = 0; i < 8; i++) {
                    const uint16_t v = rows[i * r + j];
                    tile[j * 8 + i] = v;
                    m = (uint16_t)(v & 0x7FFF) > m ? (uint16_t)(v & 0x7FFF) : m;
                }
        }
        if (N > n8 && r) {
            memcpy(tail_dst[p], b + n8 * r, (size_t)((N - n8) * r) * 2);
            m = mag_max(b + n8 * r, (N - n8) * r, m);
        }
    }
    return m >= 0x7C00 ? 1 : 0;
}
