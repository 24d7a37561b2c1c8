// fp16 rounding as ggml does it (round to nearest, ties to even), for kernels that reproduce
// llama.cpp's fp16 steps: the Q8_0 activation scale and the f16 KV cache's attention.

#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

// fp16 bits -> float (exact)
static inline float f16_to_f32(uint16_t h) {
    const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    float r;
    if (e == 0) {
        r = ldexpf((float)m, -24);
    } else if (e == 31) {
        r = m ? NAN : INFINITY;
    } else {
        uint32_t o = ((e + 112u) << 23) | (m << 13);
        memcpy(&r, &o, 4);
    }
    return (h & 0x8000u) ? -r : r;
}

// float -> fp16 bits, ties to even: ggml's software FP32_TO_FP16 (the F16C instruction's
// result too)
static inline uint16_t f32_to_f16(float f) {
    uint32_t w;
    memcpy(&w, &f, 4);
    const uint32_t sign = w & 0x80000000u, shl1 = w + w;
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t bias = shl1 & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    const uint32_t bb = (bias >> 1) + 0x07800000u;
    float fb;
    memcpy(&fb, &bb, 4);
    base = fb + base;
    uint32_t bits;
    memcpy(&bits, &base, 4);
    return (uint16_t)((sign >> 16) |
                      (shl1 > 0xFF000000u ? 0x7E00u : ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu)));
}

// x rounded to the nearest fp16 value, as a float
static inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }
