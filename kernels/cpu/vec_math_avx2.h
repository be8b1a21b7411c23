// AVX2 + FMA elementwise math for the AVX2 kernels (internal header: include it only from
// functions compiled with ALLOY_TARGET_AVX2). The same method and coefficients as
// vec_math_avx512.h's exp; AVX2 has no vscalefps, so 2^n is applied as two exponent-field
// factors 2^(n >> 1) and 2^(n - (n >> 1)), each a normal float over the clamped range
// (n in [-150, 128] after the clamp): the result underflows to 0 and overflows to inf as expf does.
#pragma once
#include <immintrin.h>

#include <cstdint>

#define ALLOY_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace alloy::cpu::avx2 {

// Sum of the 8 lanes.
ALLOY_TARGET_AVX2 inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 8 x 8 transpose of r[0..8) (rows) into c[0..8) (columns).
ALLOY_TARGET_AVX2 inline void transpose8(const __m256 (&r)[8], __m256 (&c)[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        c[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        c[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

// 2^k for integer k in [-126, 127], as a float built in the exponent field.
ALLOY_TARGET_AVX2 inline __m256 pow2i(__m256i k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

// e^x, max error ~2 ulp (x clamped to [-104, 88.8]: beyond, the result is 0 or inf anyway).
ALLOY_TARGET_AVX2 inline __m256 exp(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.8f)), _mm256_set1_ps(-104.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // r = x - n ln2, ln2 = hi + lo with hi exact in few bits, so n * hi is exact.
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);  // |r| <= 0.35
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    return _mm256_mul_ps(_mm256_mul_ps(p, pow2i(n1)), pow2i(_mm256_sub_epi32(ni, n1)));
}

// sigmoid(x) = 1 / (1 + e^-x), evaluated as in ref::sigmoid so no branch exponentiates a large
// positive number: e = e^-|x| in (0, 1]; x >= 0: 1 / (1 + e), x < 0: e / (1 + e).
ALLOY_TARGET_AVX2 inline __m256 sigmoid(__m256 x) {
    const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    const __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), ax));
    const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    const __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(inv, _mm256_mul_ps(inv, e), neg);
}

// SiLU(x) = x sigmoid(x).
ALLOY_TARGET_AVX2 inline __m256 silu(__m256 x) { return _mm256_mul_ps(x, sigmoid(x)); }

// Lanes [0, n) set (0 < n < 8), for _mm256_maskload_ps / _mm256_maskstore_ps of a tail.
ALLOY_TARGET_AVX2 inline __m256i tail_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace alloy::cpu::avx2
