// 16 x 16 fp32 (or 32-bit) transpose in AVX-512 registers: out[c] lane r = in[r] lane c.
// Four shuffle stages (32-bit, 64-bit, then two 128-bit), 64 shuffles. Internal to the
// matmul kernels; include only from files whose functions target AVX-512.
#pragma once
#include <immintrin.h>

namespace alloy::cpu::mm {

__attribute__((target("avx512f"), always_inline)) inline void transpose16(const __m512* in, __m512* out) {
    __m512 u[16], r[16];
    for (int i = 0; i < 8; ++i) {  // u[2i]: rows 2i, 2i+1 x cols 4k, 4k+1 (128-bit block k); u[2i+1]: 4k+2, 4k+3
        u[2 * i] = _mm512_unpacklo_ps(in[2 * i], in[2 * i + 1]);
        u[2 * i + 1] = _mm512_unpackhi_ps(in[2 * i], in[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // r[4i + j]: column 4k + j of rows 4i..4i+3, in block k
        const __m512d a = _mm512_castps_pd(u[4 * i]), b = _mm512_castps_pd(u[4 * i + 2]);
        const __m512d c = _mm512_castps_pd(u[4 * i + 1]), d = _mm512_castps_pd(u[4 * i + 3]);
        r[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int j = 0; j < 4; ++j) {  // column 4k + j = block k of r[j], r[4+j], r[8+j], r[12+j]
        const __m512 a0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44);
        const __m512 a1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
        const __m512 b0 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44);
        const __m512 b1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
        out[j] = _mm512_shuffle_f32x4(a0, b0, 0x88);
        out[4 + j] = _mm512_shuffle_f32x4(a0, b0, 0xDD);
        out[8 + j] = _mm512_shuffle_f32x4(a1, b1, 0x88);
        out[12 + j] = _mm512_shuffle_f32x4(a1, b1, 0xDD);
    }
}

}  // namespace alloy::cpu::mm
